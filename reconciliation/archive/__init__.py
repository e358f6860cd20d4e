"""Retention and archives (docs/archive.md): settled, sealed attempts older than their tenant's
and tool's retention rule are written to archive files with their receipts (``archive.py``),
to a folder or an S3-compatible bucket (``store.py``), then removed from the database in small
batches; ``restore.py`` loads archives into a scratch database for an investigation. Archives are
verified by ``attempts.verify_export.check_archive`` wherever they are read."""
