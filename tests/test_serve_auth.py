"""Basic auth of `gpumon serve` in process: the real bcrypt, watched (never replaced) where a
test must know when a check runs; the failure budget on a clock the test moves."""

from __future__ import annotations

import base64
import threading

import bcrypt
import pytest

from gpumon.faces.serve import auth as auth_module
from gpumon.faces.serve.auth import (
    FAILURES_BURST,
    BasicAuth,
    FailureBudget,
    Verdict,
    client_key,
)


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def hashed(password: str, cost: int = 4) -> str:
    return bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class WatchedBcrypt:
    """bcrypt itself, noting each check's hash; ``hold`` makes a check wait before running."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = bcrypt.checkpw
        self.hashes: list[bytes] = []
        self.hold: threading.Event | None = None
        self.inside = threading.Event()
        monkeypatch.setattr(bcrypt, "checkpw", self.checkpw)

    def checkpw(self, password: bytes, hashed_password: bytes) -> bool:
        self.hashes.append(hashed_password)
        self.inside.set()
        if self.hold is not None:
            self.hold.wait(30)
        return self.real(password, hashed_password)


def test_a_good_header_is_let_in_while_a_wrong_one_is_being_checked(monkeypatch) -> None:
    """Before, every check held one lock through bcrypt: a scrape waited on each guess."""
    watched = WatchedBcrypt(monkeypatch)
    auth = BasicAuth([("prom", hashed("right"))])
    good = header("prom", "right")
    assert auth.check(good, "10.0.0.1") is Verdict.OK  # checked once, then remembered
    watched.hold = threading.Event()
    watched.inside.clear()
    guess = threading.Thread(target=auth.check, args=(header("prom", "guess"), "10.0.0.9"))
    guess.start()
    assert watched.inside.wait(10)  # the guess is inside bcrypt now
    answer: list[Verdict] = []
    scrape = threading.Thread(target=lambda: answer.append(auth.check(good, "10.0.0.1")))
    scrape.start()
    scrape.join(10)
    still_checking = guess.is_alive()
    watched.hold.set()
    guess.join(10)
    assert answer == [Verdict.OK] and still_checking


def test_failed_checks_are_budgeted_per_address_without_bcrypt(monkeypatch) -> None:
    watched = WatchedBcrypt(monkeypatch)
    clock = Clock()
    auth = BasicAuth([("prom", hashed("right"))], FailureBudget(clock=clock))
    good = header("prom", "right")
    assert auth.check(good, "10.0.0.1") is Verdict.OK
    verdicts = [auth.check(header("prom", f"guess{i}"), "10.0.0.9") for i in range(30)]
    assert verdicts == [Verdict.REFUSED] * FAILURES_BURST + [Verdict.THROTTLED] * (
        30 - FAILURES_BURST
    )
    assert len(watched.hashes) == 1 + FAILURES_BURST  # a throttled guess costs no bcrypt
    assert auth.check(header("prom", "guess"), "10.0.0.2") is Verdict.REFUSED  # its own budget
    assert auth.check(good, "10.0.0.9") is Verdict.OK  # a remembered header still passes
    assert auth.check(header("prom", "right "), "10.0.0.9") is Verdict.THROTTLED
    clock.t += auth_module.FAILURE_REFILL_S  # one guess more per refill
    assert auth.check(header("prom", "guess"), "10.0.0.9") is Verdict.REFUSED
    assert auth.check(header("prom", "guess"), "10.0.0.9") is Verdict.THROTTLED


def test_the_budget_table_is_bounded() -> None:
    budget = FailureBudget(burst=1, size=100, clock=Clock())
    for i in range(1000):
        assert budget.take(f"10.0.{i // 256}.{i % 256}")
    assert len(budget._table) == 100
    assert not budget.take("10.0.3.231")  # the most recent are kept
    assert budget.take("10.0.0.0")  # the oldest forgotten


def test_a_right_password_gives_its_failure_back() -> None:
    auth = BasicAuth([("prom", hashed("right"))], FailureBudget(clock=Clock()))
    for _ in range(FAILURES_BURST - 1):
        assert auth.check(header("prom", "guess"), "10.0.0.9") is Verdict.REFUSED
    assert auth.check(header("prom", "right"), "10.0.0.9") is Verdict.OK  # spent, given back
    assert auth.check(header("prom", "guess"), "10.0.0.9") is Verdict.REFUSED  # the last one
    assert auth.check(header("prom", "guess"), "10.0.0.9") is Verdict.THROTTLED


def test_an_unknown_user_costs_as_much_as_the_costliest_known_one(monkeypatch) -> None:
    """Before, an unknown user was checked at cost 10 whatever the users' cost: 78 ms against
    306 ms at cost 12 told which users exist."""
    watched = WatchedBcrypt(monkeypatch)
    auth = BasicAuth([("a", hashed("x", 4)), ("b", hashed("y", 6))])
    assert auth.check(header("nobody", "x"), "10.0.0.9") is Verdict.REFUSED
    assert auth.check(header("a", "nope"), "10.0.0.9") is Verdict.REFUSED
    decoy, known = watched.hashes
    assert decoy.split(b"$")[2] == b"06" and known.split(b"$")[2] == b"04"
    assert auth.check(header("nobody", "y"), "10.0.0.8") is Verdict.REFUSED  # never equal


def test_an_ipv6_host_is_one_client_whatever_address_of_its_64_it_uses() -> None:
    auth = BasicAuth([("prom", hashed("right"))], FailureBudget(clock=Clock()))
    for i in range(FAILURES_BURST):  # each guess from another address of one /64
        assert auth.check(header("prom", "guess"), f"2001:db8:1:2::{i:x}") is Verdict.REFUSED
    assert auth.check(header("prom", "guess"), "2001:db8:1:2:ffff::1") is Verdict.THROTTLED
    assert auth.check(header("prom", "guess"), "2001:db8:1:3::1") is Verdict.REFUSED
    assert client_key("::ffff:10.0.0.9") == client_key("10.0.0.9") == "10.0.0.9"
