"""Who may scrape: basic auth against bcrypt hashes, a failure budget per client, a rate limit.

bcrypt is slow on purpose (~90 ms at cost 10, ~4 s at 16), so a check must never stand
between a legitimate scrape and its answer:

- Prometheus sends the same header every scrape: a header that once checked out is
  remembered (a keyed digest of it, bounded), and a remembered header is let in at once,
  without bcrypt and without waiting on any check in progress;
- a wrong password costs its sender, not others: each client address (an IPv6 one by
  its /64, which one host holds whole) has a budget of failed checks
  (``FAILURES_BURST``, one more every ``FAILURE_REFILL_S``), kept in a bounded table;
  spent, the address gets 429 without a bcrypt check until it refills.  A failure is
  counted once bcrypt has answered "wrong", never before: twenty scrapes with the right
  password arriving at once on a fresh daemon all pass (counted up front, the second
  half found the budget spent by checks that had not yet answered).  The budget is
  looked at again once a check may run, so guesses queued for a check slot stop there
  when it is spent: at most ``CHECKS_AT_ONCE`` guesses run past it;
- a request that waited for a check slot first looks whether the same header was found
  good meanwhile (one bcrypt check for a burst of identical scrapes);
- at most ``CHECKS_AT_ONCE`` bcrypt checks run at once, so guesses from many addresses
  cost the node a bounded share of its CPU;
- an unknown user is checked against a decoy hash of the users' highest cost, so the
  answer does not say which users exist.

The web configuration's ``rate_limit`` (the toolkit's one bucket for every request)
counts only requests that passed the credentials: an attacker's 401s cannot empty it.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from enum import Enum

# Failed checks a client address may make at once, and the time that gives one back: ten
# guesses a minute, sustained, where a guess took 13 a second before.
FAILURES_BURST = 10
FAILURE_REFILL_S = 6.0
# Client addresses remembered; beyond, the one seen longest ago is forgotten.
FAILURE_TABLE_SIZE = 4096
# Headers remembered as good (Prometheus jobs, probes: a handful in practice).
GOOD_CACHE_SIZE = 256
# bcrypt checks running at once, and how long a request waits for its turn.
CHECKS_AT_ONCE = 2
CHECK_WAIT_S = 10.0


class Verdict(Enum):
    """What the credentials of one request earn it."""

    OK = "ok"
    REFUSED = "refused"  # 401
    THROTTLED = "throttled"  # 429: the address spent its failures, or no check could run


class TokenBucket:
    """``burst`` tokens, one more every ``interval_s``; ``take`` spends one if there is one."""

    def __init__(self, interval_s: float, burst: int, now: float) -> None:
        self.interval_s = interval_s
        self.burst = burst
        self.tokens = float(burst)
        self.at = now

    def refill(self, now: float) -> float:
        self.tokens = min(self.burst, self.tokens + (now - self.at) / self.interval_s)
        self.at = now
        return self.tokens

    def take(self, now: float) -> bool:
        if self.refill(now) >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class RateLimit:
    """A token bucket (the toolkit's rate_limit): ``burst`` requests, one more per interval."""

    def __init__(self, interval_s: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._bucket = TokenBucket(interval_s, burst, clock())
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            return self._bucket.take(self._clock())


class FailureBudget:
    """Failed checks per client address: a token bucket each, in a bounded LRU table."""

    def __init__(
        self,
        burst: int = FAILURES_BURST,
        refill_s: float = FAILURE_REFILL_S,
        size: int = FAILURE_TABLE_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.burst, self.refill_s, self.size = burst, refill_s, size
        self._clock = clock
        self._table: OrderedDict[str, TokenBucket] = OrderedDict()
        self._lock = threading.Lock()

    def _bucket(self, client: str, now: float) -> TokenBucket:
        """``client``'s bucket, made the most recent (caller holds the lock)."""
        bucket = self._table.pop(client, None) or TokenBucket(self.refill_s, self.burst, now)
        self._table[client] = bucket  # the most recent last
        while len(self._table) > self.size:
            self._table.popitem(last=False)
        return bucket

    def left(self, client: str) -> bool:
        """Whether ``client`` may still fail a check (spends nothing)."""
        now = self._clock()
        with self._lock:
            return self._bucket(client, now).refill(now) >= 1.0

    def failed(self, client: str) -> None:
        """A check of ``client``'s answered "wrong": one failure spent (below zero when
        checks that were let in together all failed: the refill takes that much longer)."""
        now = self._clock()
        with self._lock:
            bucket = self._bucket(client, now)
            bucket.refill(now)
            bucket.tokens -= 1.0

    def take(self, client: str) -> bool:
        """Spend one of ``client``'s failures if it has one left (False: none left)."""
        now = self._clock()
        with self._lock:
            return self._bucket(client, now).take(now)


def client_key(address: str) -> str:
    """Whose failures a request's are: the IPv4 address, or the IPv6 address's /64."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class BasicAuth:
    """Checks ``Authorization: Basic`` against bcrypt hashes, as the exporter-toolkit does."""

    def __init__(
        self, users: Iterable[tuple[str, str]], failures: FailureBudget | None = None
    ) -> None:
        import bcrypt

        self._bcrypt = bcrypt
        self.users = {user: hashed.encode() for user, hashed in users}
        self.failures = failures if failures is not None else FailureBudget()
        # A hash of the users' highest cost that no password matches: its salt says how
        # much work a check does, the rest is never equal to a computed hash.
        cost = max(int(h.split(b"$")[2]) for h in self.users.values())
        self._decoy = bcrypt.gensalt(cost) + b"." * 31
        self._key = os.urandom(32)  # remembered headers are kept as keyed digests only
        self._good: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()  # the remembered headers; never held during bcrypt
        self._checks = threading.BoundedSemaphore(CHECKS_AT_ONCE)

    def check(self, header: str | None, client: str) -> Verdict:
        if not header or not header.startswith("Basic "):
            return Verdict.REFUSED
        digest = hashlib.blake2b(header.encode(), key=self._key).digest()
        with self._lock:
            if digest in self._good:
                self._good.move_to_end(digest)
                return Verdict.OK
        try:
            user, _, password = base64.b64decode(header[6:], validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return Verdict.REFUSED  # no check made: nothing spent
        client = client_key(client)
        if not self.failures.left(client):
            return Verdict.THROTTLED
        hashed = self.users.get(user)
        if not self._checks.acquire(timeout=CHECK_WAIT_S):
            return Verdict.THROTTLED
        try:
            with self._lock:  # found good while this request waited for its slot
                if digest in self._good:
                    return Verdict.OK
            if not self.failures.left(client):  # spent by guesses checked while it waited
                return Verdict.THROTTLED
            try:
                ok = self._bcrypt.checkpw(password.encode(), hashed or self._decoy)
            except ValueError:  # webconfig refuses hashes bcrypt cannot read; never a crash
                ok = False
        finally:
            self._checks.release()
        if not (ok and hashed is not None):
            self.failures.failed(client)  # counted now that bcrypt has said "wrong"
            return Verdict.REFUSED
        with self._lock:
            self._good[digest] = None
            while len(self._good) > GOOD_CACHE_SIZE:
                self._good.popitem(last=False)
        return Verdict.OK
