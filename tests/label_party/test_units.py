"""Fine-grained tests of the pure pieces: exact units, per-part composition, label
validation, domains and settings."""

from __future__ import annotations

import io
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from label_party.config import Settings
from label_party.datasets.domain import ClassificationDomain, RegressionDomain
from label_party.exceptions import InvalidLabelsError, InvalidRequestError
from label_party.labels.validation import read_table, validate
from label_party.ledger.accounting import Cost, compose, fits
from label_party.ledger.units import epsilon_decimal, epsilon_units


def test_ten_tenths_exhaust_one_exactly() -> None:
    budget = epsilon_units(Decimal("1.0"))
    tenth = Cost(epsilon_units(Decimal("0.1")), 0, None)
    spend = compose([tenth] * 10)
    assert spend.worst(None) == (budget, 0)
    ok, left, _ = fits(spend, tenth, epsilon_budget=budget, delta_budget=0)
    assert not ok and left == 0
    assert epsilon_decimal(budget - spend.all_epsilon) == 0


def test_too_many_decimals_are_refused_not_rounded() -> None:
    with pytest.raises(InvalidRequestError):
        epsilon_units(Decimal("0.1234567890123"))
    # Multiplied in Decimal's default 28 digits, this one rounded to 0.1 (helper-74).
    with pytest.raises(InvalidRequestError, match="decimal places"):
        epsilon_units(Decimal("0.1000000000000000000000000000001"))
    with pytest.raises(InvalidRequestError, match="too large"):
        epsilon_units(Decimal("1e999"))


def test_amounts_arrive_as_exact_decimals_or_clear_refusals() -> None:
    """Text with a huge exponent overflowed Decimal's context inside the validator
    (a 500), and a numpy float's repr is not a number (helper-74)."""
    import pydantic

    from shared.protocol import ReleaseCreate

    def epsilon(value: object) -> Decimal:
        body = ReleaseCreate.model_validate({"mechanism": {"name": "rr"}, "epsilon": value})
        return body.epsilon

    assert epsilon(np.float64(0.5)) == Decimal("0.5") and epsilon(0.1) == Decimal("0.1")
    assert epsilon("2.5e-3") == Decimal("0.0025") and epsilon(3) == Decimal(3)
    for text in ("1e99999999999999999999", "1e-99999999999", "1" * 41):
        with pytest.raises(pydantic.ValidationError, match="spelled as one"):
            epsilon(text)


def test_a_mechanism_never_runs_at_more_than_the_charged_epsilon() -> None:
    """``float`` rounds an amount to the nearest double, up half the time: 1,464 of
    2,003 ledger values near 19.9 ran randomized response above the ε charged
    (helper-69). A release runs at the largest double not above its amount."""
    from fractions import Fraction

    from label_party.trainings.plan import below_charged
    from shared.protocol import float_below

    rng = np.random.default_rng()
    for units in rng.integers(1, 25 * 10**12, size=2000):
        amount = epsilon_decimal(int(units))
        below = float_below(amount)
        assert Fraction(below) <= Fraction(amount) < Fraction(np.nextafter(below, np.inf))
        assert Fraction(below_charged(float(amount), 10**12)) == Fraction(below)
    assert float_below(Decimal("19.900000004948")) < float(Decimal("19.900000004948"))
    # An amount a double holds exactly is run at as it is (0.5, not 0.49999999999999994).
    assert below_charged(0.5, 10**12) == 0.5 and below_charged(1e-5, 10**18) < 1e-5
    assert below_charged(1000.5, 10**12) == 1000.5 and below_charged(1e6 + 0.5, 10**12) < 1e6 + 0.5


@pytest.mark.parametrize("text", ["1_0", "\u0661", "+0.1", ".5", "1e", "Infinity"])
def test_the_command_line_takes_amounts_spelled_as_numbers_only(text: str) -> None:
    """``--epsilon-budget 1_0`` made a budget of 10 (helper-70)."""
    import argparse

    from label_party.cli import positive_privacy_amount
    from shared.cli_errors import amount_argument  # the --epsilon of the other commands

    with pytest.raises(argparse.ArgumentTypeError, match="expected a number"):
        positive_privacy_amount(text)
    with pytest.raises(argparse.ArgumentTypeError, match="expected a number"):
        amount_argument(text)
    assert positive_privacy_amount(" 0.5 ") == "0.5" and positive_privacy_amount("2E-3") == "2E-3"


def test_parts_compose_separately() -> None:
    spend = compose([Cost(5, 0, ("a",)), Cost(3, 0, ("b",)), Cost(1, 0, None)])
    assert spend.of_part("a") == (6, 0) and spend.of_part("b") == (4, 0)
    assert spend.worst(None) == (6, 0) and spend.worst(["b"]) == (4, 0)
    assert fits(spend, Cost(4, 0, ("a",)), epsilon_budget=10, delta_budget=0)[0]
    assert not fits(spend, Cost(5, 0, None), epsilon_budget=10, delta_budget=0)[0]


def _parquet(ids: list[object], labels: list[object]) -> io.BytesIO:
    sink = io.BytesIO()
    pq.write_table(pa.table({"example_id": ids, "label": labels}), sink)
    sink.seek(0)
    return sink


DOMAIN = RegressionDomain(min=0, max=10)


def test_bad_rows_are_listed_by_number_and_reason_without_values() -> None:
    csv = b"example_id,label\na,1\na,2\nb,x1y2\nc,inf\nd,11.25\n,3\ne,\nf,4\n"
    with pytest.raises(InvalidLabelsError) as err:
        validate(read_table(io.BytesIO(csv), "csv"), DOMAIN)
    detail = err.value.detail
    assert detail["bad_rows"] == 7
    assert [r["row"] for r in detail["rows"]] == [1, 2, 3, 4, 5, 6, 7]
    assert "x1y2" not in str(detail) and "11.25" not in str(detail)


def test_at_most_100_rows_are_reported() -> None:
    ids = [f"e{i}" for i in range(500)]
    with pytest.raises(InvalidLabelsError) as err:
        validate(read_table(_parquet(ids, [float("nan")] * 500), "parquet"), DOMAIN)
    assert err.value.detail["bad_rows"] == 500 and len(err.value.detail["rows"]) == 100


def test_clip_and_formats() -> None:
    table = read_table(_parquet([1, 2], [-5.0, 50.0]), "parquet")
    clean, n = validate(table, RegressionDomain(min=0, max=10, clip=True))
    assert n == 2 and clean.column("label").to_pylist() == [0.0, 10.0]
    assert clean.column("example_id").to_pylist() == ["1", "2"]
    jsonl = b'{"example_id": "a", "label": 3}\n{"example_id": "b", "label": 4.5}\n'
    clean, _ = validate(read_table(io.BytesIO(jsonl), "jsonl"), DOMAIN)
    assert clean.column("label").to_pylist() == [3.0, 4.5]
    with pytest.raises(InvalidLabelsError):
        read_table(io.BytesIO(b'{"example_id": "a"}\n'), "jsonl")


def test_classes_by_name_and_index() -> None:
    names = ClassificationDomain(classes=["no", "yes"])
    clean, _ = validate(read_table(_parquet(["a", "b"], ["yes", "no"]), "parquet"), names)
    assert clean.column("label").to_pylist() == [1.0, 0.0]
    with pytest.raises(InvalidLabelsError) as err:
        validate(
            read_table(_parquet(["a", "b"], [1.0, 1.5]), "parquet"),
            ClassificationDomain(num_classes=2),
        )
    assert err.value.detail["rows"] == [{"row": 2, "reason": "unknown class"}]


def test_grid() -> None:
    assert np.allclose(RegressionDomain(min=0, max=1, step=0.25).grid(), [0, 0.25, 0.5, 0.75, 1])
    assert RegressionDomain(min=0, max=1).grid().size == 101
    with pytest.raises(ValueError):
        RegressionDomain(min=0, max=1, step=0.3)


@pytest.mark.parametrize("token", [None, "", "admin", "changeme", "short"])
def test_production_refuses_weak_admin_tokens(token: str | None) -> None:
    with pytest.raises(ValueError, match="ADMIN_TOKEN"):
        Settings(mode="production", admin_token=token)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e12, 0.0, -1.0])
def test_durations_are_positive_finite_and_at_most_a_day(value: float) -> None:
    """``inf`` and ``1e12`` seconds were taken, and the worker then failed at run
    time: a timestamp out of range at every claim, the job left queued (helper-73)."""
    from feature_party.config import Settings as FeatureSettings

    with pytest.raises(ValueError, match="poll_seconds"):
        Settings(mode="dev", worker_poll_seconds=value)
    with pytest.raises(ValueError, match="poll_seconds"):
        FeatureSettings(admin_token="x" * 32, poll_seconds=value)


def test_crash_hook_only_in_test_mode() -> None:
    with pytest.raises(ValueError):
        Settings(mode="dev", test_crash_point="release_before_commit")
    assert Settings(mode="test", test_crash_point="release_before_commit").test_crash_point


def test_deterministic_seed_only_in_test_mode() -> None:
    """DESIGN.md §3.5: a seeded randomizer only behind the explicit test setting;
    `dev` is for local trials, whose releases must still be unpredictable."""
    with pytest.raises(ValueError, match="LABELDP_TEST_SEED needs LABELDP_MODE=test"):
        Settings(mode="dev", test_seed=1)
    assert Settings(mode="test", test_seed=1).test_seed == 1


@pytest.mark.parametrize(
    ("data", "fmt", "message"),
    [
        (b"example_id,value\na,1\n", "csv", "the file lacks column(s) label"),
        (b"id;label\nsecret,1\n", "csv", "the file lacks column(s) example_id, label"),
        (b"", "csv", "the file could not be read as csv with columns example_id, label"),
        (b"not parquet", "parquet", "the file could not be read as parquet with columns"),
        (b"", "jsonl", "the file has no rows"),
        (b"\n\n", "jsonl", "the file has no rows"),
    ],
)
def test_unreadable_files_are_one_file_level_422(data: bytes, fmt: str, message: str) -> None:
    with pytest.raises(InvalidLabelsError) as err:
        read_table(io.BytesIO(data), fmt)  # type: ignore[arg-type]
    assert err.value.detail == [] and err.value.message.startswith(message)
    assert "secret" not in err.value.message


def test_jsonl_lines_that_are_not_objects_are_listed_before_values_are_checked() -> None:
    data = b'{"example_id": "a", "label": 1}\n{"example_id": "b", "label": "x1y2"}\n[1]\n'
    with pytest.raises(InvalidLabelsError) as err:
        read_table(io.BytesIO(data), "jsonl")
    assert err.value.detail == {"bad_rows": 1, "rows": [{"row": 3, "reason": "not a JSON object"}]}
    assert "x1y2" not in str(err.value.detail) + err.value.message


def test_jsonl_mixed_scalar_types_are_read_as_text_and_blamed_on_the_right_rows() -> None:
    # Arrow types a column from its first row; the string label comes first here,
    # so only row 1 is wrong, and integer ids beside string ids are ids like any other.
    data = b'{"example_id": 7, "label": "x1y2"}\n\n{"example_id": "b", "label": 1}\n'
    table = read_table(io.BytesIO(data), "jsonl")
    assert table.column("example_id").to_pylist() == ["7", "b"]
    with pytest.raises(InvalidLabelsError) as err:
        validate(table, RegressionDomain(min=0, max=2))
    assert err.value.detail["rows"] == [{"row": 1, "reason": "label is not a number"}]
    ok = read_table(
        io.BytesIO(b'{"example_id": 1, "label": 1}\n{"example_id": "c", "label": "2"}\n'), "jsonl"
    )
    clean, count = validate(ok, RegressionDomain(min=0, max=2))
    assert count == 2 and clean.column("label").to_pylist() == [1.0, 2.0]


def test_jsonl_nested_values_and_missing_columns_are_named() -> None:
    with pytest.raises(InvalidLabelsError) as err:
        read_table(
            io.BytesIO(b'{"example_id": "a", "label": 1}\n{"example_id": "b", "label": [1]}\n'),
            "jsonl",
        )
    assert err.value.detail["rows"] == [{"row": 2, "reason": "label is not a string or number"}]
    with pytest.raises(InvalidLabelsError) as err:
        read_table(
            io.BytesIO(b'{"example_id": "a", "value": 1}\n{"example_id": 2, "value": 1}\n'), "jsonl"
        )
    assert err.value.message == "the file lacks column(s) label"


def test_a_training_shows_only_its_own_checks_messages() -> None:
    """A ValueError from numpy or torch may quote the data it choked on (a label):
    only the project's own checks, written label-free, show their text."""
    from label_party.labeldp_pro.accounting import calibrate_noise
    from label_party.trainings.worker import public_error

    with pytest.raises(ValueError) as parsing:
        float("label 7.123456")
    assert public_error(parsing.value) == "ValueError in the worker (see the worker's log)"
    with pytest.raises(ValueError) as reshaping:
        np.asarray([1.0, 2.0]).reshape(3)
    assert "reshape" not in public_error(reshaping.value)
    with pytest.raises(ValueError) as ours:
        calibrate_noise(-1.0, 1e-5, 0.1, 10)
    assert public_error(ours.value) == str(ours.value)  # our check: its message is for users


def test_a_json_column_takes_a_number_that_is_not_finite_as_null(database_url: str) -> None:
    """A diverged LabelDP-Pro training's progress and history hold NaN: Postgres
    refused the heartbeat that wrote it (SQLite stored text no JSON reader takes)."""
    import sqlalchemy as sa

    from label_party.db import connect
    from shared import json_columns

    value = {"loss": float("nan"), "history": [{"norm": np.float64("inf")}, {"norm": 1.5}]}
    database = connect(database_url)
    try:
        with database.engine.connect() as conn:
            stored = conn.execute(sa.select(sa.literal(value, sa.JSON))).scalar_one()
    finally:
        database.dispose()
    assert stored == {"loss": None, "history": [{"norm": None}, {"norm": 1.5}]}
    assert json_columns.dumps({"a": (1.0, 2)}) == '{"a": [1.0, 2]}'  # finite: json.dumps's


def test_times_read_back_in_utc_whatever_the_connection_s_zone(database_url: str) -> None:
    """Postgres answers ``timestamptz`` in the session's ``TimeZone``: with the
    server set to New York the API said ``…-05:00`` (and a naive value bound for
    such a column was read as New York time). Both parties' columns read aware UTC,
    one engine serving both (their statements were cached under one key)."""
    from datetime import UTC, datetime, timedelta, timezone

    import sqlalchemy as sa

    from label_party.db import connect
    from shared.timestamps import UTCDateTime

    noon = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
    given = [noon, noon.replace(tzinfo=None), noon.astimezone(timezone(timedelta(hours=5)))]
    database = connect(database_url)
    try:
        with database.engine.connect() as conn:
            postgres = conn.dialect.name == "postgresql"
            if postgres:
                conn.exec_driver_sql("SET TIME ZONE 'America/New_York'")
            for zone_kept in (True, False):
                column = UTCDateTime(timezone=zone_kept)
                read = [conn.execute(sa.select(sa.literal(v, column))).scalar_one() for v in given]
                if postgres:  # the type is in the SQL text, cached by the type's key:
                    # the zone-less column's cast was compiled as the other's, and a
                    # string without a zone read as New York time (17:00 UTC).
                    cast = sa.cast(sa.literal("2026-11-24 12:00:00"), column)
                    at = conn.execute(sa.select(cast)).scalar_one()
                    read.append(at if not zone_kept else at - timedelta(hours=5))
                assert read == [noon] * len(read), zone_kept
                assert all(at.utcoffset() == timedelta(0) for at in read)
    finally:
        database.dispose()


def test_trainings_in_test_mode_draw_different_seeds() -> None:
    """Every training in test mode was seeded with LABELDP_TEST_SEED alone, so two
    trainings drew the same noise (helper-76); outside test mode there is no seed."""
    from label_party.trainings.worker import seed_in_test_mode

    seeds = {seed_in_test_mode(7, training_id) for training_id in ("t1", "t2", "t3")}
    assert len(seeds) == 3 and all(0 <= s < 2**63 for s in seeds if s is not None)
    assert seed_in_test_mode(7, "t1") == seed_in_test_mode(7, "t1")  # repeatable
    assert seed_in_test_mode(None, "t1") is None
