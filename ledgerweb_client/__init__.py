"""ledgerweb_client: record every side effect in the ledger before it happens.

Standard library only, no Django. Typical use::

    from ledgerweb_client import LedgerClient, SendResult, ProviderTimeout

    with LedgerClient("https://ledger.example.com", token) as ledger:
        result = ledger.call(
            tenant="acme", task_id="task-42", tool_name="email.send",
            idempotency_key="invoice:acme:2026-08-11:send",
            args={"to": "billing@acme.test", "template": "invoice"},
            send=send_invoice_email,  # fn(attempt) -> SendResult, raises Provider* exceptions
        )

See ``docs/client.md`` and ``LedgerClient.call`` / ``LedgerClient.attempt``.
"""

from . import client, errors
from .client import *  # noqa: F403 (the client and its types: client.__all__, listed once there)
from .client import __version__
from .errors import *  # noqa: F403 (every exception: errors.__all__, listed once there)
from .receipts import LogView, ReceiptError, verify_receipt

__all__ = ["LogView", "ReceiptError", "verify_receipt", "__version__"]
__all__ += client.__all__
__all__ += errors.__all__
