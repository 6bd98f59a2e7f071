"""The append-only, hash-chained audit log (DESIGN.md §3.6).

Entry ``n`` stores ``hash = SHA-256(canonical JSON of [seq, created_at, actor,
action, dataset_id, payload, prev_hash])`` with ``prev_hash`` the hash of entry
``n − 1`` (64 zeros for the first). Appends are serialized
(:func:`label_party.db.lock_audit_chain`) and numbered without gaps, so
verification can tell a deleted entry from a missing one.

Verification recomputes the chain, then re-derives every dataset's budget and
every part's spend from the entries and compares them with the ledger tables.
Payloads carry ids and privacy amounts only — never a label value.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from label_party.audit import repository
from label_party.datasets import repository as datasets_repository
from label_party.db import lock_audit_chain, read_snapshot
from label_party.ledger import repository as ledger_repository
from label_party.ledger.accounting import Cost, compose
from label_party.models import AuditEntry, LedgerEntry

GENESIS = "0" * 64

#: Audit actions that record a ledger entry: a release, a release whose mechanism
#: failed after reading the labels (charged all the same), and a LabelDP-Pro
#: training (an approximate-DP release: its ε and δ add to the whole-dataset scope).
SPENDING_ACTIONS = frozenset({"release.created", "release.failed", "training.reserved"})


def spend_payload(entry: LedgerEntry) -> dict[str, Any]:
    """What a :data:`SPENDING_ACTIONS` entry records of its ledger entry: the fields
    :func:`verify` re-derives every dataset's spend from."""
    return {
        "ledger_entry_id": entry.id,
        "epsilon_units": entry.epsilon,
        "delta_units": entry.delta,
        "parts": entry.parts,
    }


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def entry_hash(
    seq: int,
    created_at: str,
    actor: str,
    action: str,
    dataset_id: str | None,
    payload: str,
    prev_hash: str,
) -> str:
    text = canonical([seq, created_at, actor, action, dataset_id, payload, prev_hash])
    return hashlib.sha256(text.encode()).hexdigest()


def append(
    session: Session,
    *,
    actor: str,
    action: str,
    dataset_id: str | None = None,
    payload: dict[str, Any] | None = None,
) -> AuditEntry:
    """Append one entry at the end of the chain (inside the caller's transaction)."""
    lock_audit_chain(session)
    last = repository.last(session)
    seq = 1 if last is None else last.seq + 1
    prev = GENESIS if last is None else last.hash
    created_at = datetime.now(UTC).isoformat()
    body = canonical(payload or {})
    entry = AuditEntry(
        seq=seq,
        created_at=created_at,
        actor=actor,
        action=action,
        dataset_id=dataset_id,
        payload=body,
        prev_hash=prev,
        hash=entry_hash(
            seq=seq,
            created_at=created_at,
            actor=actor,
            action=action,
            dataset_id=dataset_id,
            payload=body,
            prev_hash=prev,
        ),
    )
    session.add(entry)
    session.flush()
    return entry


def page(session: Session, *, dataset_id: str | None, after: int, limit: int) -> list[AuditEntry]:
    """Entries after sequence number ``after`` (of one dataset, or all), in order."""
    return repository.page(session, dataset_id=dataset_id, after=after, limit=limit)


@dataclass(frozen=True)
class Verification:
    ok: bool
    entries: int
    first_bad_entry: int | None = None
    reason: str | None = None
    #: The last entry's ``"seq:hash"``: kept outside the database, it is an anchor
    #: that a later verification checks the chain still passes through.
    head: str | None = None


@dataclass(frozen=True)
class Anchor:
    """An entry an auditor recorded (``"seq:hash"``, a verification's ``head``)."""

    seq: int
    hash: str

    @classmethod
    def parse(cls, text: str) -> Anchor:
        seq, colon, digest = text.partition(":")
        if not (colon and seq.isdigit() and int(seq) >= 1):
            raise ValueError("an anchor is SEQ:HASH (SEQ ≥ 1), as a verification's head gives it")
        if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
            raise ValueError(
                f"an anchor's HASH is 64 hexadecimal characters (this one has {len(digest)}), "
                "as a verification's head gives it"
            )
        return cls(int(seq), digest.lower())


def verify(session: Session, *, batch: int = 5000, anchor: Anchor | None = None) -> Verification:
    """Recompute the chain and the budget ledger from the audit entries, and check
    that the chain passes through ``anchor``.

    The chain is unkeyed: whoever can write the database can rewrite it whole and
    recompute every hash. An anchor kept elsewhere (a ticket, a signed mail) is
    what such a rewrite cannot match.

    Reads the log, the datasets and the ledger in one snapshot (:func:`read_snapshot`):
    a release committed between two of those reads would otherwise look like a
    ledger entry with no audit entry. Call it on a session that has read nothing.
    """
    read_snapshot(session)
    prev, expected_seq, count = GENESIS, 1, 0
    budgets: dict[str, tuple[int, int, int]] = {}  # dataset -> (seq, ε budget, δ budget)
    # ledger entry -> (seq, dataset, cost), from releases and trainings
    releases: dict[str, tuple[int, str, Cost]] = {}
    after = 0
    while rows := repository.chain_page(session, after=after, limit=batch):
        for row in rows:
            count += 1
            seq, created, actor, action, dataset_id, payload, prev_hash, digest = row
            if seq != expected_seq:
                return Verification(False, count, expected_seq, "entry missing from the chain")
            if (
                prev_hash != prev
                or entry_hash(seq, created, actor, action, dataset_id, payload, prev_hash) != digest
            ):
                return Verification(False, count, seq, "hash does not match the entry")
            if anchor is not None and seq == anchor.seq and digest != anchor.hash:
                return Verification(
                    False, count, seq, "the chain was rewritten: the entry differs from the anchor"
                )
            problem = _derive(seq, action, dataset_id, payload, budgets, releases)
            if problem is not None:
                return Verification(False, count, seq, problem)
            prev, expected_seq, after = digest, expected_seq + 1, seq
    if anchor is not None and anchor.seq >= expected_seq:
        return Verification(
            False, count, None, "the chain is shorter than the anchor: entries were removed"
        )
    result = _verify_ledger(session, count, budgets, releases)
    # A failed check gives no head: an auditor keeping whatever head it sees would
    # anchor on a state that failed (a ledger edit leaves the chain itself intact).
    head = f"{after}:{prev}" if count and result.ok else None
    return dataclasses.replace(result, head=head)


def _derive(
    seq: int,
    action: str,
    dataset_id: str | None,
    payload_text: str,
    budgets: dict[str, tuple[int, int, int]],
    releases: dict[str, tuple[int, str, Cost]],
) -> str | None:
    """Record what entry ``seq`` says of a budget or a spend; the problem, if any.

    A payload is read only through its hash-checked text, so a malformed one here is
    a chain rewritten whole (hashes recomputed): reported, not a server error."""
    try:
        payload = json.loads(payload_text)
    except ValueError:
        return "payload is not JSON"
    try:
        if action == "dataset.created" and dataset_id is not None:
            budgets[dataset_id] = (
                seq,
                int(payload["epsilon_budget_units"]),
                int(payload["delta_budget_units"]),
            )
        elif action in SPENDING_ACTIONS and dataset_id is not None:
            if payload["ledger_entry_id"] in releases:
                return "ledger entry logged twice"
            parts = payload.get("parts")
            cost = Cost(
                int(payload["epsilon_units"]),
                int(payload["delta_units"]),
                None if parts is None else tuple(parts),
            )
            releases[payload["ledger_entry_id"]] = (seq, dataset_id, cost)
    except (KeyError, TypeError, ValueError, AttributeError):
        return f"the payload of a {action} entry lacks its amounts"
    return None


def _verify_ledger(
    session: Session,
    count: int,
    budgets: dict[str, tuple[int, int, int]],
    releases: dict[str, tuple[int, str, Cost]],
) -> Verification:
    bad: list[tuple[int, str]] = []
    for dataset in datasets_repository.list_all(session):
        logged = budgets.get(dataset.id)
        if logged is None:
            bad.append((0, f"dataset {dataset.id} has no creation entry"))
        elif (logged[1], logged[2]) != (dataset.epsilon_budget, dataset.delta_budget):
            bad.append((logged[0], f"budget of dataset {dataset.id} differs from the log"))
    seen: set[str] = set()
    for entry in ledger_repository.all_entries(session):
        seen.add(entry.id)
        logged_release = releases.get(entry.id)
        parts = None if entry.parts is None else tuple(entry.parts)
        if logged_release is None:
            bad.append((0, f"ledger entry {entry.id} has no audit entry"))
        elif logged_release[1:] != (entry.dataset_id, Cost(entry.epsilon, entry.delta, parts)):
            bad.append((logged_release[0], f"ledger entry {entry.id} differs from the log"))
    for ledger_id, (seq, _dataset, _cost) in releases.items():
        if ledger_id not in seen:
            bad.append((seq, f"ledger entry {ledger_id} is missing"))
    # Re-derived per-part spend must stay within each logged budget.
    for dataset_id, (seq, eps_budget, delta_budget) in budgets.items():
        costs = [c for (_s, d, c) in releases.values() if d == dataset_id]
        spend = compose(costs)
        eps, delta = spend.worst(None)
        if eps > eps_budget or delta > delta_budget:
            last = max((s for (s, d, _c) in releases.values() if d == dataset_id), default=seq)
            bad.append((last, f"dataset {dataset_id} spends more than its budget"))
    if bad:
        seq, reason = min(bad, key=lambda item: (item[0] == 0, item[0]))
        return Verification(False, count, seq or None, reason)
    return Verification(True, count)
