"""Checks 6 and 7 of ``attempts.audit_verify`` and the transparency log: the checkpoint chain
and the config chain, the log's leaves, tree and notes (``[log]``), and what the newest
checkpoint must carry by configuration: the log's signatures and the witnesses' cosignatures
(``[signature]``, ``[witness]``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import rfc8785

from attempts.audit_verify.chains import CHECKPOINTS, CONFIG, LEAVES, Verifier
from attempts.audit_verify.digests import leaf_digest, load_json
from attempts.verify_export import (
    EXT_AUTHORITY,
    EXT_CHECKPOINT,
    EXT_CONFIG,
    GENESIS,
    LOG_FORMAT,
    LogBuilder,
    LogCheckpoint,
    MerkleTree,
    NoteError,
    Report,
    cannot_hash,
    checkpoint_hash,
    config_event_hash,
    note_signed_by,
    split_note,
)

CHECKPOINT_SQL = f"""
SELECT id, seq, prev_hash, root, size, config_length, config_head, sealed_at, hash, format,
       authority
FROM {CHECKPOINTS} WHERE seq >= {{seq}} ORDER BY seq
"""  # noqa: S608
# A ledger from before the transparency log: every checkpoint is format 1.
OLD_CHECKPOINT_SQL = f"""
SELECT id, seq, prev_hash, root, size, config_length, config_head, sealed_at, hash, 1, ''
FROM {CHECKPOINTS} WHERE seq >= {{seq}} ORDER BY seq
"""  # noqa: S608
LEAF_SQL = f"""
SELECT checkpoint_id, position, attempt_id, length, head FROM {LEAVES}
WHERE checkpoint_id > (SELECT COALESCE(MAX(id), 0) FROM {CHECKPOINTS} WHERE seq <= {{seq}})
ORDER BY checkpoint_id, position
"""  # noqa: S608
# The leaves of the checkpoints before the transparency log, whose roots are checked here: a
# logged checkpoint's (format 2 on) are hashed by log_checks(), and of them only the places are
# checked here, by the database, which returns the leaves that are not at their place among
# their checkpoint's (none in a sound ledger) rather than every leaf.
UNLOGGED_LEAF_SQL = LEAF_SQL.replace(
    "ORDER BY",
    f"AND checkpoint_id NOT IN (SELECT id FROM {CHECKPOINTS} WHERE format >= {LOG_FORMAT})\n"  # noqa: S608
    "ORDER BY",
)
if "NOT IN" not in UNLOGGED_LEAF_SQL:  # LEAF_SQL changed: keep the two in step
    raise AssertionError("UNLOGGED_LEAF_SQL no longer narrows LEAF_SQL")
MISPLACED_SQL = f"""
SELECT checkpoint_id, position FROM (
    SELECT l.checkpoint_id, l.position,
           ROW_NUMBER() OVER (PARTITION BY l.checkpoint_id ORDER BY l.position) - 1 AS place
    FROM {LEAVES} l
    WHERE l.checkpoint_id IN (SELECT id FROM {CHECKPOINTS} WHERE format >= {LOG_FORMAT})
      AND l.checkpoint_id > (SELECT COALESCE(MAX(id), 0) FROM {CHECKPOINTS} WHERE seq <= {{seq}})
) placed
WHERE position <> place
ORDER BY checkpoint_id, position
"""  # noqa: S608
CONFIG_SQL = f"""
SELECT id, seq, subject, action, actor_kind, actor, before, after, reason, created_at,
       prev_hash, hash FROM {CONFIG} ORDER BY seq
"""  # noqa: S608


def checkpoints(verifier: Verifier) -> None:
    """``[checkpoint]`` checkpoints run 1, 2, 3, ... each hashing the one before, each root the
    Merkle root of its leaves; ``[config]`` the config chain links and matches every checkpoint."""
    config_hashes = config_chain(verifier)
    checkpoint_chain(verifier, config_hashes)


def config_chain(verifier: Verifier) -> list[str]:
    """``[config]``: each configuration change hashes to its stored hash and links to the one
    before it, numbered 1, 2, 3, ...; returns their hashes in order."""
    config_hashes: list[str] = []
    prev = GENESIS
    for values in verifier.stream(CONFIG_SQL):
        row = dict(
            zip(
                (
                    "id",
                    "seq",
                    "subject",
                    "action",
                    "actor_kind",
                    "actor",
                    "before",
                    "after",
                    "reason",
                    "created_at",
                    "prev_hash",
                    "hash",
                ),
                values,
                strict=True,
            )
        )
        where = f"config change {row['seq']} ({row['subject']})"
        unhashable = ""
        try:
            row["before"], row["after"] = load_json(row["before"]), load_json(row["after"])
            recomputed = config_event_hash(row)
        except (TypeError, ValueError, rfc8785.CanonicalizationError) as exc:
            recomputed, unhashable = None, cannot_hash(exc)
        if recomputed is None or recomputed != row["hash"]:
            verifier.bad(
                "config",
                f"{where}: its fields do not match its hash: it was edited{unhashable}",
            )
        if row["seq"] != len(config_hashes) + 1:
            verifier.bad(
                "config",
                f"{where}: expected change {len(config_hashes) + 1}: changes were deleted, "
                "inserted or reordered",
            )
        if row["prev_hash"] != prev:
            verifier.bad("config", f"{where}: broken link to the change before it")
        prev = row["hash"]
        config_hashes.append(row["hash"])
    return config_hashes


def checkpoint_chain(verifier: Verifier, config_hashes: list[str]) -> None:
    """``[checkpoint]``: each checkpoint hashes to its stored hash, follows the one before it,
    and has the root of its leaves; ``[config]`` the config changes it sealed are still there.
    With ``--since``, from the checkpoint verified before."""
    start = verifier.since[0] if verifier.since else 0
    has_log = verifier.has_log()
    leaves = verifier.stream((UNLOGGED_LEAF_SQL if has_log else LEAF_SQL).format(seq=int(start)))
    pending: tuple | None = next(leaves, None)
    misplaced = (
        verifier.stream(MISPLACED_SQL.format(seq=int(start))) if has_log else (r for r in ())
    )
    out_of_place: tuple | None = next(misplaced, None)
    prev = GENESIS
    expected_seq = start or 1
    checkpoint_sql = CHECKPOINT_SQL if has_log else OLD_CHECKPOINT_SQL
    for values in verifier.stream(checkpoint_sql.format(seq=int(start))):
        pk, seq, prev_hash, root, size, config_length, config_head, sealed_at, stored = values[:9]
        if verifier.since and seq == start:
            # Verified by the run that printed it; everything after must chain to it.
            if stored != verifier.since[1]:
                verifier.bad(
                    "anchor",
                    f"checkpoint {seq} is {str(stored)[:16]}…, not the {verifier.since[1][:16]}… "
                    "verified before (--since): history up to it was rewritten",
                )
            prev, expected_seq, verifier.checkpoint = stored, seq + 1, (seq, stored)
            continue
        where = f"checkpoint {seq}"
        _checkpoint_itself(verifier, values, where, expected_seq=expected_seq, prev=prev)
        mine: list[bytes] = []
        logged = values[9] >= LOG_FORMAT  # its leaves are hashed once, by log_checks()
        while pending is not None and pending[0] == pk:
            _, position, attempt_id, length, head = pending
            if position != len(mine):
                verifier.bad("checkpoint", f"{where}: leaf {position} is out of place")
            mine.append(b"" if logged else leaf_digest(attempt_id, length, head))
            pending = next(leaves, None)
        while out_of_place is not None and out_of_place[0] == pk:  # a logged checkpoint's
            verifier.bad("checkpoint", f"{where}: leaf {out_of_place[1]} is out of place")
            out_of_place = next(misplaced, None)
        if logged:
            pass  # the log's root over every leaf: checked by log_checks()
        elif len(mine) != size or MerkleTree(mine).root() != root:
            verifier.bad(
                "checkpoint",
                f"{where}: its {len(mine)} leaves do not give its root over {size}: sealed "
                "heads were edited, deleted or added",
            )
        if config_length > len(config_hashes) or (
            config_length and config_hashes[config_length - 1] != config_head
        ):
            verifier.bad(
                "config",
                f"{where} sealed {config_length} config changes ending "
                f"{str(config_head)[:16]}…, which the config chain no longer has",
            )
        if stored in verifier.anchors:
            verifier.found.add(stored)
        prev = stored
        expected_seq = seq + 1
        verifier.checkpoint = (seq, stored)
    leaves.close()
    misplaced.close()
    if verifier.since and (verifier.checkpoint is None or verifier.checkpoint[0] < start):
        verifier.bad(
            "anchor",
            f"checkpoint {start} (--since) is not in this ledger: the checkpoints after it "
            "were cut, or this is another ledger",
        )


def _checkpoint_itself(
    verifier: Verifier, values: tuple, where: str, *, expected_seq: int, prev: str
) -> None:
    """One checkpoint's own fields hash to its stored hash, and it follows the one before."""
    _pk, seq, prev_hash, root, size, config_length, config_head, sealed_at, stored = values[:9]
    fields = {
        "format": values[9],
        "authority": values[10],
        "seq": seq,
        "prev_hash": prev_hash,
        "root": root,
        "size": size,
        "config_length": config_length,
        "config_head": config_head,
        "sealed_at": sealed_at,
    }
    if checkpoint_hash(fields) != stored:
        verifier.bad("checkpoint", f"{where}: its fields do not match its hash: it was edited")
    if seq != expected_seq:
        verifier.bad(
            "checkpoint",
            f"{where}: expected checkpoint {expected_seq}: checkpoints were deleted or inserted",
        )
    if prev_hash != prev:
        verifier.bad(
            "checkpoint",
            f"{where}: its prev_hash is not the hash of the checkpoint before it: an "
            "earlier checkpoint was changed, deleted or inserted",
        )


# -- The transparency log (checkpoint format 2, attempts/log.py): separate from the chain walk.

LOG_ENTRY_SQL = """
SELECT e."index", l.attempt_id, l.length, l.head, n.hash
FROM attempts_logentry e JOIN attempts_checkpointleaf l ON l.id = e.leaf_id
LEFT JOIN attempts_lognode n ON n.level = 0 AND n."index" = e."index"
ORDER BY e."index"
"""
LOG_CHECKPOINT_SQL = """
SELECT id, seq, size, root, config_length, config_head, authority, note FROM attempts_checkpoint
WHERE format >= 2 ORDER BY seq
"""
LOG_SIGNATURE_SQL = """
SELECT checkpoint_id, kind, line FROM attempts_checkpointsignature ORDER BY checkpoint_id, id
"""


def log_checks(verifier: Verifier, *, log_keys=(), witness_keys=()) -> None:
    """``[log]``: the log's leaves, in order, are the sealed heads, and the tree over them has
    each format-2 checkpoint's root at its size; each checkpoint's note states its own size,
    root, config head and authority digest. ``[signature]``: with the log's verifier keys, every
    stored log signature verifies; with witness keys, every stored cosignature does."""
    if not verifier.has_log():
        return
    checkpoints = list(verifier.stream(LOG_CHECKPOINT_SQL))
    if not checkpoints:
        return
    _log_tree(verifier, checkpoints)
    _log_notes(verifier, checkpoints, list(log_keys), list(witness_keys))


def _log_tree(verifier: Verifier, checkpoints: list[tuple]) -> None:
    """The log's leaves are the sealed heads, in order, and each checkpoint's root is the
    tree's at its size."""
    by_size: dict[int, list[tuple]] = {}
    for row in checkpoints:
        by_size.setdefault(row[2], []).append(row)
    builder = LogBuilder()

    def at_size() -> None:
        for row in by_size.pop(builder.size, ()):
            if builder.root().hex() != row[3]:
                verifier.bad(
                    "log",
                    f"checkpoint {row[1]}: its root is not the log's root at size {row[2]}: "
                    "logged heads were edited, removed or inserted",
                )

    at_size()  # checkpoints that sealed only configuration changes before any leaf
    expected_index = 0
    for index, attempt_id, length, head, stored in verifier.stream(LOG_ENTRY_SQL):
        if index != expected_index:
            verifier.bad("log", f"log leaf {expected_index} is missing (next is {index})")
            expected_index = index
        value = leaf_digest(attempt_id, length, head)
        if stored is None or bytes(stored) != value:
            verifier.bad(
                "log",
                f"log leaf {index}'s stored hash is not the hash of its sealed head "
                f"({attempt_id} at {length}): the log was edited",
            )
        builder.append(value)
        expected_index += 1
        at_size()
    for rows in by_size.values():
        for row in rows:
            verifier.bad(
                "log", f"checkpoint {row[1]} covers {row[2]} leaves; the log holds {builder.size}"
            )


def _log_notes(
    verifier: Verifier, checkpoints: list[tuple], log_keys: list[Any], witness_keys: list[Any]
) -> None:
    """Each checkpoint's note states its own size, root and heads, and every stored signature
    by a key given verifies."""
    signatures: dict[int, list[tuple[str, str]]] = {}
    for checkpoint_id, kind, line in verifier.stream(LOG_SIGNATURE_SQL):
        signatures.setdefault(checkpoint_id, []).append((kind, line))
    for pk, seq, size, root, config_length, config_head, authority, note in checkpoints:
        where = f"checkpoint {seq}"
        try:
            body = LogCheckpoint.parse(note)
        except NoteError as exc:
            verifier.bad("log", f"{where}: its note does not parse: {exc}")
            continue
        claims = (
            body.size == size
            and body.root.hex() == root
            and body.extension(EXT_CHECKPOINT) == [str(seq)]
            and body.extension(EXT_CONFIG) == [str(config_length), config_head]
            and (body.extension(EXT_AUTHORITY) or [""]) == [authority]
        )
        if not claims:
            verifier.bad("log", f"{where}: its note does not state its own size, root and heads")
        for kind, line in signatures.get(pk, ()):
            keys = log_keys if kind == "log" else witness_keys
            if not keys:
                continue
            try:
                _, (signature,) = split_note("x\n\n" + line)
            except (NoteError, ValueError):
                verifier.bad("signature", f"{where}: a malformed {kind} signature line")
                continue
            known = [k for k in keys if k.name == signature.name and k.id == signature.id]
            if known and not any(note_signed_by(note, signature, k) for k in known):
                verifier.bad(
                    "signature",
                    f"{where}: the {kind} signature of {signature.name} does not verify: the "
                    "checkpoint was changed after it was signed",
                )


# -- The newest checkpoint verifies on its own (docs/audit-chain.md, "What stands on keys"):
# decided from configuration and keys, never from rows an attacker can edit. A database writer
# can recompute every hash, but not make a signature of the log's key or of a witness, nor
# change the signer's memory (a file beside the key) or this process's configuration.


@dataclass(frozen=True)
class Trust:
    """What the newest checkpoint must carry, from configuration: the log's verifier keys (the
    current one and the old ones still trusted), the witnesses' keys and their quorum, and the
    newest tree the signer remembers signing (``memory``: where, ``signed``: (size, root), or
    None when it has signed nothing there yet). ``require_signed``: with no log key
    configured, unsigned checkpoints fail instead of being a note. ``restored``: the database
    is a restored copy (a backup), older than the signer's memory may be: a remembered tree
    larger than its log is then a note, not a rollback."""

    log_keys: tuple[Any, ...] = ()
    witness_keys: tuple[Any, ...] = ()
    quorum: int = 0
    memory: str = ""
    signed: tuple[int, bytes] | None = None
    require_signed: bool = False
    restored: bool = False


def configured_trust(*, require_signed: bool = False, restored: bool = False) -> Trust:
    """``Trust`` from the settings (``LEDGERWEB_TLOG_*``) and the signer's memory. Raises
    ``log.LogKeyError`` / ``NoteError`` for a key that is malformed or unreadable."""
    from attempts import log

    kept = log.signed_tree()
    return Trust(
        log_keys=tuple(log.verifier_keys()),
        witness_keys=tuple(w.key for w in log.witnesses()),
        quorum=log.quorum(),
        memory=str(kept[0]) if kept else "",
        signed=kept[1] if kept else None,
        require_signed=require_signed,
        restored=restored,
    )


TRUST_CHECKPOINT_SQL = """
SELECT id, seq, size, root, note FROM attempts_checkpoint WHERE format >= 2 ORDER BY seq
"""
# Problems of one kind listed before "and N more".
TRUST_LISTED = 5


def checkpoint_trust(verifier: Verifier, report: Report, trust: Trust) -> None:
    """``[signature]``: with a log key configured, checkpoints are signed by a configured key
    (or an old verifier key) up to the newest signed one, which is where the signer's memory
    outside the database says; a log signature by any other key is reported. ``[witness]``:
    with witnesses configured, a signed checkpoint is cosigned by the quorum of their keys.
    The newest checkpoints wait a moment for their signature and cosignatures (the worker adds
    them after sealing): those are a note. Rows (signatures, ``WitnessState``) are evidence
    checked with the keys, never trusted for what they say."""
    if not verifier.has_log():
        return
    checkpoints = list(verifier.stream(TRUST_CHECKPOINT_SQL))
    if not checkpoints:
        return
    if not trust.log_keys:
        message = (
            "checkpoints are not signed: no log key is configured (LEDGERWEB_TLOG_KEY_FILE or "
            "LEDGERWEB_TLOG_SIGN_COMMAND), so a rewrite of the whole database is seen only "
            "against a checkpoint hash kept elsewhere (--expect-head)"
        )
        if trust.require_signed:
            verifier.bad("signature", message)
        else:
            report.notes.append(message)
        return
    signed, cosigners, strangers, unconfigured_witnesses = _signatures(verifier, trust, checkpoints)
    seqs = [row[1] for row in checkpoints]
    _log_signed(verifier, report, trust, seqs, signed, strangers)
    _signer_memory(verifier, report, trust, checkpoints, signed)
    _witness_quorum(verifier, report, trust, seqs, signed, cosigners)
    if unconfigured_witnesses:
        report.notes.append(
            "cosignatures by witnesses that are not configured are not counted: "
            + ", ".join(sorted(unconfigured_witnesses))
        )


def _signatures(
    verifier: Verifier, trust: Trust, checkpoints: list[tuple]
) -> tuple[set[int], dict[int, set[str]], list[str], set[str]]:
    """The stored signature lines, checked with the configured keys: the checkpoints the log's
    key signed, each checkpoint's cosigning witnesses, log signatures by keys not configured,
    and witnesses not configured."""
    lines: dict[int, list[tuple[str, str]]] = {}
    for checkpoint_id, kind, line in verifier.stream(LOG_SIGNATURE_SQL):
        lines.setdefault(checkpoint_id, []).append((kind, line))
    signed: set[int] = set()
    cosigners: dict[int, set[str]] = {}
    strangers: list[str] = []
    unconfigured_witnesses: set[str] = set()
    for pk, seq, _size, _root, note in checkpoints:
        for kind, line in lines.get(pk, ()):
            try:
                _, (signature,) = split_note("x\n\n" + line)
            except (NoteError, ValueError):
                continue  # reported by log_checks
            if kind == "log":
                keys = [
                    k for k in trust.log_keys if (k.name, k.id) == (signature.name, signature.id)
                ]
                if not keys:
                    strangers.append(
                        f"checkpoint {seq}: signed by {signature.name} (key id "
                        f"{signature.id.hex()}), which is neither the log's configured key nor "
                        "a listed old verifier key (LEDGERWEB_TLOG_OLD_VERIFIER_KEYS)"
                    )
                elif any(note_signed_by(note, signature, k) for k in keys):
                    signed.add(seq)
            else:
                keys = [
                    k
                    for k in trust.witness_keys
                    if (k.name, k.id) == (signature.name, signature.id)
                ]
                if not keys:
                    unconfigured_witnesses.add(signature.name)
                elif any(note_signed_by(note, signature, k) for k in keys):
                    cosigners.setdefault(seq, set()).add(signature.name)
    return signed, cosigners, strangers, unconfigured_witnesses


def _log_signed(
    verifier: Verifier,
    report: Report,
    trust: Trust,
    seqs: list[int],
    signed: set[int],
    strangers: list[str],
) -> None:
    """Every checkpoint up to the newest signed one carries the log key's signature, and none
    a stranger's; the newest after it wait for theirs (a note)."""
    for message in strangers[:TRUST_LISTED]:
        verifier.bad("signature", message)
    if len(strangers) > TRUST_LISTED:
        verifier.bad("signature", f"and {len(strangers) - TRUST_LISTED} more such signatures")
    names = ", ".join(sorted({k.name for k in trust.log_keys}))
    if not signed:
        verifier.bad(
            "signature",
            f"no checkpoint carries a valid signature of the log's key ({names}): the "
            f"{len(seqs)} checkpoints were made without it, or history was rewritten and the "
            "signatures deleted",
        )
    else:
        newest = max(signed)
        gaps = [seq for seq in seqs if seq < newest and seq not in signed]
        for seq in gaps[:TRUST_LISTED]:
            verifier.bad(
                "signature",
                f"checkpoint {seq} carries no valid signature of the log's key, though "
                f"checkpoint {newest} after it does: its signature was deleted, or it was "
                "inserted",
            )
        if len(gaps) > TRUST_LISTED:
            verifier.bad("signature", f"and {len(gaps) - TRUST_LISTED} more unsigned checkpoints")
        waiting = sum(1 for seq in seqs if seq > newest)
        if waiting:
            report.notes.append(
                f"{waiting} checkpoints after checkpoint {newest} wait for the log's signature "
                "(the worker signs each after sealing)"
            )


def _signer_memory(
    verifier: Verifier, report: Report, trust: Trust, checkpoints: list[tuple], signed: set[int]
) -> None:
    """The newest tree the signer signed (its memory, outside the database) is a signed
    checkpoint of this log: deleting the newest signatures, rolling back, or rewriting what
    they covered shows here even when older signatures were left alone."""
    if trust.signed is None:
        report.notes.append(
            f"the signer's memory of the newest tree it signed ({trust.memory or 'none'}) is "
            "not on this host or empty: the newest signed checkpoint is pinned by its "
            "signature and the witnesses only"
        )
        return
    size, root = trust.signed
    if any(s == size and r == root.hex() and seq in signed for _, seq, s, r, _ in checkpoints):
        return
    if trust.restored and size > max(row[2] for row in checkpoints):
        report.notes.append(
            f"the log's signer has since signed a tree of {size} leaves: this restored copy is "
            "older, as a backup is (its own checkpoints verify with the keys)"
        )
        return
    verifier.bad(
        "signature",
        f"the log's signer last signed a tree of {size} leaves with root {root.hex()[:16]}… "
        f"(its memory outside the database, {trust.memory}), and no checkpoint here is that "
        "tree with a valid signature: history was rewritten or rolled back, or the signatures "
        "were deleted",
    )


def _witness_quorum(
    verifier: Verifier,
    report: Report,
    trust: Trust,
    seqs: list[int],
    signed: set[int],
    cosigners: dict[int, set[str]],
) -> None:
    """With witnesses configured, a signed checkpoint is cosigned by the quorum of their keys;
    the newest wait for them a moment (a note)."""
    if not trust.witness_keys or trust.quorum < 1 or not signed:
        return
    witnessed = [
        seq for seq in seqs if seq in signed and len(cosigners.get(seq, ())) >= trust.quorum
    ]
    names = ", ".join(sorted({k.name for k in trust.witness_keys}))
    if not witnessed:
        verifier.bad(
            "witness",
            f"no checkpoint is cosigned by {trust.quorum} of the configured witnesses ({names}): "
            "they are down or behind, or their cosignatures were deleted",
        )
        return
    waiting = sum(1 for seq in seqs if seq > witnessed[-1])
    if waiting:
        report.notes.append(
            f"{waiting} checkpoints after checkpoint {witnessed[-1]} wait for the witnesses' "
            "cosignatures"
        )
