"""The job keys `hysync serve` handed out, kept across its own restart.

A job's key (given to the connection that admitted it, shared with the script's other
ranks) is the proof of ownership. A restarted serve reads its jobs back from the switch
but not their keys; without them it could only let *anybody* claim an adopted job. So serve
keeps, per job, the SHA-256 of its key (never the key) and the slots it was given in a
file only its user can read. After a restart an adopted job is claimed only with the key
whose digest matches, or by the operator; a job the file does not know (the file was
removed) waits for the operator.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hysync.controlplane.serve.client import ServeError


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_matches(key: str | None, expected_digest: str | None) -> bool:
    """Whether `key` is the one whose digest is `expected_digest` (in constant time)."""
    if key is None or expected_digest is None:
        return False
    return hmac.compare_digest(digest(key).encode(), expected_digest.encode())


def default_path(grpc_addr: str, device_id: int) -> Path:
    """$XDG_STATE_HOME/hysync/serve-ADDR-DEVICE.json (~/.local/state by default): one file
    per switch, so two serves of two switches on one machine keep apart."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "hysync" / f"serve-{re.sub(r'[^A-Za-z0-9.]+', '_', grpc_addr)}-{device_id}.json"


@dataclass(frozen=True, slots=True)
class KeptKey:
    digest: str
    slots: tuple[int, int]


class KeyStore:
    """job id -> KeptKey, in `path` (mode 0600, replaced atomically on every change)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.keys: dict[int, KeptKey] = self._load()

    def _load(self) -> dict[int, KeptKey]:
        try:
            data = json.loads(self.path.read_text())
            return {int(job): KeptKey(str(row["digest"]), (int(row["slots"][0]),
                                                           int(row["slots"][1])))
                    for job, row in data["jobs"].items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
            raise ServeError(f"cannot read serve's job keys {self.path}: {err}; remove the "
                             "file (jobs found on the switch then wait for the operator's "
                             "claim) or pass --state-file") from None

    def get(self, job_id: int, slots: tuple[int, int]) -> str | None:
        """The digest kept for `job_id`, if it was kept for these slots (a job id reused
        by a job serve did not admit has none)."""
        kept = self.keys.get(job_id)
        return kept.digest if kept is not None and kept.slots == slots else None

    def put(self, job_id: int, key_digest: str, slots: tuple[int, int]) -> None:
        self.keys[job_id] = KeptKey(key_digest, slots)
        self._save()

    def drop(self, job_ids: list[int]) -> None:
        dropped = [j for j in job_ids if self.keys.pop(j, None) is not None]
        if dropped:
            self._save()

    def _save(self) -> None:
        data = {"jobs": {str(j): {"digest": k.digest, "slots": list(k.slots)}
                         for j, k in sorted(self.keys.items())}}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".serve-keys.")
            try:
                with os.fdopen(fd, "w") as f:  # mkstemp's file is 0600 already
                    json.dump(data, f)
                os.replace(tmp, self.path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as err:
            raise ServeError(f"cannot write serve's job keys {self.path}: "
                             f"{err.strerror or err}; pass --state-file with a writable "
                             "path") from None
