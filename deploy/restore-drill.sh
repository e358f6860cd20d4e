#!/usr/bin/env bash
# Restore drill (docs/deploy.md, "Backups"): restore the newest (or the given) pg_dump of the
# ledger into a scratch database, verify its audit chain there, and drop the scratch database.
# A backup nobody has restored is a hope, not a backup: run this on a schedule.
#
# usage: restore-drill.sh [DUMP_FILE]
# Environment: LEDGERWEB_BACKUP_DIR (default /var/backups/ledgerweb), LEDGERWEB_DRILL_DATABASE_URL
# (the scratch database to create, default postgres://ledgerweb@127.0.0.1:5432/ledgerweb_restore_drill),
# LEDGERWEB_COMMAND (default /opt/ledgerweb/venv/bin/ledgerweb).
set -euo pipefail
dir="${LEDGERWEB_BACKUP_DIR:-/var/backups/ledgerweb}"
dump="${1:-$(ls -1t "$dir"/ledger-*.dump 2>/dev/null | head -n 1)}"
[ -n "$dump" ] && [ -f "$dump" ] || { echo "restore-drill: no dump found in $dir" >&2; exit 1; }
url="${LEDGERWEB_DRILL_DATABASE_URL:-postgres://ledgerweb@127.0.0.1:5432/ledgerweb_restore_drill}"
ledgerweb="${LEDGERWEB_COMMAND:-/opt/ledgerweb/venv/bin/ledgerweb}"
name="${url##*/}"
server="${url%/*}/postgres"
echo "restore-drill: restoring $dump into $name"
dropdb --if-exists --maintenance-db="$server" "$name"
createdb --maintenance-db="$server" "$name"
trap 'dropdb --if-exists --maintenance-db="$server" "$name"' EXIT
pg_restore --no-owner --exit-on-error --dbname="$url" "$dump"
# --restored: the log's signer has signed past this dump since; that is not a rollback here.
DATABASE_URL="$url" "$ledgerweb" verify_audit --restored
echo "restore-drill: $dump restores and its audit chain verifies"
