"""EC2 fault injection for the local cloud: a WSGI layer in front of moto's application.

moto always has capacity and never throttles, so on its own it cannot show how the daemon copes with
a crowded region. `FaultInjector` wraps moto's WSGI app inside the same in-process HTTP server (no
extra network hop) and, for the EC2 query API only, answers some requests itself with the error
document real EC2 sends, byte-compatible with what botocore parses:

- `gate(check)`: every request is first authorized by `check` (the tests' IAM evaluator: moto evaluates
  no policy); a refusal is EC2's 403 `UnauthorizedOperation` and moto never sees the request.
- `refuse(type, probability=p, subnet_id=s, code=c)`: RunInstances for that type (in that subnet, or
  any) gets HTTP 500 `InsufficientInstanceCapacity` (or another refusal `code`, such as 400
  `InsufficientFreeAddressesInSubnet` or `VcpuLimitExceeded`), always or with probability p drawn from a
  seeded RNG (`reseed()` to replay a sequence). Nothing is created in moto for a refused call.
- `stock(type, machines, subnet_id=s)`: the zone has only that many more machines of the type. As on
  EC2, a RunInstances gets min(MaxCount, what is left) when that is at least MinCount, else
  `InsufficientInstanceCapacity`. Without a stock rule a RunInstances gets MaxCount machines, as EC2
  does when it has the room (moto by itself launches MinCount and ignores MaxCount: the injector
  rewrites the request that moto reads to the count EC2 would give).
- `throttle(action, times)`: the next `times` calls of an action get HTTP 503 `RequestLimitExceeded`.
- `fail(action, times, status, code)`: the next `times` calls get any other error (e.g. 500
  `InternalError`, or 401 `AuthFailure`).
- `skew_clock(seconds)`: EC2's clock runs that far ahead of this host's (behind when negative): the
  `Date` header of every response and every timestamp in EC2's answers (`launchTime`...) are shifted,
  as a region whose clock disagrees with the daemon's host would show them.

Every rule can be changed while the server runs (the test or demo thread and the server's request
threads share one lock). `calls()` counts every EC2 action the server saw, injected errors included,
which is how a benchmark can check API calls per tick from the server's side.

`price_list` answers the AWS Price List API's GetProducts (moto has none; see `pricelist`).
`be_strict(StrictEc2(...))` applies EC2's rules where moto is generous (see `ec2_strict`).

Why one file of this size: every EC2 rule that must see a request before moto does (and share its lock
and seeded draws) is one WSGI layer; services moto lacks are answered from modules of their own.

`watch(callback)` calls `callback(action, params)` in the request's thread before anything else happens to
the request (and before moto sees it): a chaos world uses it to check, at the moment a TerminateInstances
arrives, what the machines it names are doing, or to slow some calls down.

`record()` starts a call log: every EC2 request from then on, with when it arrived, its parameters and the
access key id that signed it (`Ec2Call`), so a test whose processes sign with different key ids (moto takes
any) can tell which process made each call: which keeper replica acted on which cluster, say.
"""

from __future__ import annotations

import datetime
import email.utils
import io
import random
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, parse_qsl, urlencode
from xml.sax.saxutils import escape

from swarm_autoscaler.adapters.ec2_transport import PRODUCT_USER_AGENT
from swarm_autoscaler_lab.localcloud.aws_actions import action_log_from_env
from swarm_autoscaler_lab.localcloud.ec2_strict import StrictEc2
from swarm_autoscaler_lab.localcloud.pricelist import TARGET_PREFIX as PRICE_LIST_PREFIX
from swarm_autoscaler_lab.localcloud.pricelist import PriceListService

WsgiEnviron = dict[str, Any]
StartResponse = Callable[..., Any]
WsgiApp = Callable[[WsgiEnviron, StartResponse], Iterable[bytes]]

_HTTP_REASONS = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class Ec2Call:
    """One EC2 request as it arrived (`FaultInjector.record`)."""

    at: float  # time.time() on arrival
    action: str
    params: dict[str, str]
    access_key: str  # from the SigV4 Authorization header; "" when unsigned


_CREDENTIAL = re.compile(r"Credential=([^/,\s]+)/")
# (action, form parameters, access key id) -> None (authorized) or why not (`FaultInjector.gate`)
Gate = Callable[[str, dict[str, str], str], "str | None"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """RunInstances of `type_name` (in `subnet_id`, or in any subnet when None) is refused with
    probability `probability`, with `code` (HTTP `status`)."""

    type_name: str
    probability: float = 1.0
    subnet_id: str | None = None
    code: str = "InsufficientInstanceCapacity"
    status: int = 500


@dataclass(slots=True)
class _Injected:
    status: int
    code: str
    message: str
    remaining: int


def ec2_error_document(code: str, message: str) -> bytes:
    """The XML body EC2 returns for an error (the shape botocore's EC2 parser reads)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
        f"</Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    ).encode()


SQS_TARGET_PREFIX = "AmazonSQS."  # the X-Amz-Target of SQS's JSON protocol
GARBLED = "<garbled>"  # an injected answer's code that stands for a cut-short body
GARBLED_BODY = b'<?xml version="1.0" encoding="UTF-8"?>\n<DescribeInstancesResponse><reservationSet><item'


class FaultInjector:
    """WSGI middleware: injects EC2 capacity refusals, throttling and other errors in front of `app`."""

    def __init__(self, app: WsgiApp, seed: int = 0) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._refusals: list[Refusal] = []
        self.price_list = PriceListService()  # GetProducts, answered here (see `pricelist`)
        self.strict: StrictEc2 | None = None  # EC2's rules where moto is generous (`be_strict`)
        self._stock: dict[tuple[str, str | None], int] = {}
        self._injected: dict[str, list[_Injected]] = {}
        self._calls: Counter[str] = Counter()
        self._watchers: list[Callable[[str, dict[str, str]], None]] = []
        self._audit = action_log_from_env()
        self._log: list[Ec2Call] | None = None
        self._gate: Gate | None = None
        self.capacity_refusals = 0
        self.clock_skew = 0.0  # seconds EC2's clock runs ahead of this host's

    # ----------------------------------------------------------------------------------- controls

    def refuse(
        self,
        type_name: str,
        *,
        probability: float = 1.0,
        subnet_id: str | None = None,
        code: str = "InsufficientInstanceCapacity",
    ) -> None:
        """Refuse RunInstances of `type_name` (replacing an earlier rule for the same type and subnet).
        EC2 answers a capacity shortage with HTTP 500, every other refusal with 400."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability must be within [0, 1], got {probability}")
        status = 500 if code == "InsufficientInstanceCapacity" else 400
        with self._lock:
            self._refusals = [
                r for r in self._refusals if (r.type_name, r.subnet_id) != (type_name, subnet_id)
            ]
            self._refusals.append(Refusal(type_name, probability, subnet_id, code, status))

    def stock(self, type_name: str, machines: int, *, subnet_id: str | None = None) -> None:
        """From now on, EC2 has only `machines` more of `type_name` (in `subnet_id`, or across all
        subnets when None): RunInstances gets partial fulfilment, then refusals (see the module doc)."""
        with self._lock:
            self._stock[(type_name, subnet_id)] = max(machines, 0)

    def allow(self, type_name: str | None = None) -> None:
        """Drop the refusal rules for `type_name` (every rule when None)."""
        with self._lock:
            self._refusals = [r for r in self._refusals if type_name is not None and r.type_name != type_name]
            self._stock = {
                k: v for k, v in self._stock.items() if type_name is not None and k[0] != type_name
            }

    def throttle(self, action: str, times: int = 1) -> None:
        """Answer the next `times` calls of `action` with 503 RequestLimitExceeded."""
        self.fail(action, times, status=503, code="RequestLimitExceeded", message="Request limit exceeded.")

    def fail(
        self,
        action: str,
        times: int = 1,
        *,
        status: int = 500,
        code: str = "InternalError",
        message: str = "An internal error has occurred",
    ) -> None:
        """Answer the next `times` calls of `action` with this error (queued after earlier ones)."""
        with self._lock:
            self._injected.setdefault(action, []).append(_Injected(status, code, message, times))

    def garble(self, action: str, times: int = 1) -> None:
        """Answer the next `times` calls of `action` with 200 and a cut-short body that no parser reads,
        as a loaded server sometimes does mid-run."""
        self.fail(action, times, status=200, code=GARBLED, message="")

    def skew_clock(self, seconds: float) -> None:
        """Make EC2's clock run `seconds` ahead of this host's (behind when negative); 0 undoes it."""
        self.clock_skew = float(seconds)

    def watch(self, callback: Callable[[str, dict[str, str]], None]) -> None:
        """Call `callback(action, params)` for every EC2 request, in its thread, before it is answered.
        An exception in the callback is the callback's business: it propagates to the server thread."""
        with self._lock:
            self._watchers.append(callback)

    def gate(self, check: Gate | None) -> None:
        """Authorize every EC2 request before moto sees it, as IAM does before EC2 acts (moto evaluates no
        policy): `check(action, params, access key id)` returns None to let it through, or the reason,
        answered as EC2's 403 `UnauthorizedOperation` (moto never sees the request). None, or `reset`,
        removes it."""
        with self._lock:
            self._gate = check

    def record(self) -> None:
        """Start (or restart, empty) the call log that `recorded()` returns."""
        with self._lock:
            self._log = []

    def recorded(self) -> list[Ec2Call]:
        """The calls logged since `record()`, in arrival order (a copy)."""
        with self._lock:
            return list(self._log or ())

    def be_strict(self, strict: StrictEc2 | None) -> None:
        """Apply EC2's own rules where moto is generous (see `ec2_strict`); None: moto's. `reset` keeps it."""
        self.strict = strict

    def reseed(self, seed: int) -> None:
        with self._lock:
            self._rng = random.Random(seed)

    def reset(self) -> None:
        """Drop every rule and zero the counters."""
        with self._lock:
            self._refusals.clear()
            self._stock.clear()
            self.price_list.reset()
            self._injected.clear()
            self._calls.clear()
            self.capacity_refusals = 0
            self.clock_skew = 0.0
            self._gate = None

    def calls(self) -> dict[str, int]:
        """EC2 actions seen so far, by action name (injected errors included)."""
        with self._lock:
            return dict(self._calls)

    # ----------------------------------------------------------------------------------- WSGI

    def __call__(self, environ: WsgiEnviron, start_response: StartResponse) -> Iterable[bytes]:
        target = str(environ.get("HTTP_X_AMZ_TARGET", ""))
        if target:
            return self._json_service(target, environ, start_response)
        params = _query_params(environ)
        action = params.get("Action")
        if action is None:
            return self._app(environ, start_response)
        if self._audit is not None:
            self._audit.record(environ, action, params)
        for callback in list(self._watchers):
            callback(action, params)
        if self._log is not None:
            signed = _CREDENTIAL.search(str(environ.get("HTTP_AUTHORIZATION", "")))
            call = Ec2Call(time.time(), action, params, signed.group(1) if signed else "")
            with self._lock:
                if self._log is not None:
                    self._log.append(call)
        sent = dict(params)  # the request as it came (the log keeps it); what moto reads may be rewritten
        error = self._authorize(environ, action, sent) or self._decide(action, sent)  # IAM before EC2
        strict = self.strict
        if (
            strict is not None
            and strict.only_product
            and PRODUCT_USER_AGENT not in str(environ.get("HTTP_USER_AGENT", ""))
        ):
            strict = None  # a lab world's own helper: moto as it is
        if error is None and strict is not None:
            error = strict.check(action, sent, _region(environ), params)
        skew = self.clock_skew
        if error is None and action == "RunInstances":
            _set_params(environ, {k: sent[k] for k in ("MinCount", "MaxCount")})
        if error is None:
            if not skew and strict is None:
                return self._app(environ, start_response)
            return self._skewed(environ, start_response, action, strict)
        status, code, message = error
        body = GARBLED_BODY if code == GARBLED else ec2_error_document(code, message)
        headers = [
            ("Content-Type", "text/xml;charset=UTF-8"),
            ("Content-Length", str(len(body))),
            ("Date", http_date(time.time() + skew)),
        ]
        start_response(f"{status} {_HTTP_REASONS.get(status, 'Error')}", headers)
        return [body]

    def _json_service(
        self, target: str, environ: WsgiEnviron, start_response: StartResponse
    ) -> Iterable[bytes]:
        """A JSON-protocol request (its action in a header): the Price List, answered here; SQS, moto's."""
        if target.startswith(PRICE_LIST_PREFIX):  # the Price List API, which moto does not serve
            if self._audit is not None:
                self._audit.record_names(environ, {f"pricing:{target[len(PRICE_LIST_PREFIX) :]}"})
            length = int(environ.get("CONTENT_LENGTH") or 0)
            body = environ["wsgi.input"].read(length) if length else b""
            return self.price_list.answer(target, body, start_response)
        if target.startswith(SQS_TARGET_PREFIX) and self._audit is not None:
            self._audit.record_names(environ, {f"sqs:{target[len(SQS_TARGET_PREFIX) :]}"})
        return self._app(environ, start_response)

    def _skewed(
        self,
        environ: WsgiEnviron,
        start_response: StartResponse,
        action: str = "",
        strict: StrictEc2 | None = None,
    ) -> Iterable[bytes]:
        """moto's answer with its Date header and timestamps moved by `clock_skew`, and as the strict
        EC2 gives it (`ec2_strict`), when one is set."""
        skew = self.clock_skew
        got: list[Any] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
            got[:] = [status, headers]
            return lambda _data: None  # moto returns its body; it never calls write()

        chunks = self._app(environ, capture)
        try:
            body = b"".join(chunks)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        body = shift_timestamps(body, skew) if skew else body
        if strict is not None:
            body = strict.answered(action, body)
        status, headers = got
        kept = [(k, v) for k, v in headers if k.lower() not in ("date", "content-length")]
        kept += [("Content-Length", str(len(body))), ("Date", http_date(time.time() + skew))]
        start_response(status, kept)
        return [body]

    def _authorize(
        self, environ: WsgiEnviron, action: str, params: dict[str, str]
    ) -> tuple[int, str, str] | None:
        gate = self._gate
        if gate is None:
            return None
        signed = _CREDENTIAL.search(str(environ.get("HTTP_AUTHORIZATION", "")))
        reason = gate(action, dict(params), signed.group(1) if signed else "")
        return None if reason is None else (403, "UnauthorizedOperation", reason)

    def _decide(self, action: str, params: dict[str, str]) -> tuple[int, str, str] | None:
        with self._lock:
            self._calls[action] += 1
            queue = self._injected.get(action)
            if queue:
                head = queue[0]
                head.remaining -= 1
                if head.remaining <= 0:
                    queue.pop(0)
                return head.status, head.code, head.message
            if action == "RunInstances":
                return self._run_instances(params)
        return None

    def _run_instances(self, params: dict[str, str]) -> tuple[int, str, str] | None:
        """A refusal, or None with `params` rewritten to the count EC2 gives (under the lock)."""
        type_name = params.get("InstanceType", "m1.small")
        refusal = self._refused(params)
        if refusal is not None:
            self.capacity_refusals += 1
            return refusal.status, refusal.code, _refusal_message(refusal.code, type_name, params)
        low = int(params.get("MinCount") or 1)
        high = max(int(params.get("MaxCount") or low), low)
        key = next(
            (k for k in ((type_name, params.get("SubnetId")), (type_name, None)) if k in self._stock), None
        )
        if key is not None:
            if self._stock[key] < low:
                self.capacity_refusals += 1
                return 500, "InsufficientInstanceCapacity", _capacity_message(type_name, params)
            high = min(high, self._stock[key])
            self._stock[key] -= high
        params["MinCount"] = params["MaxCount"] = str(high)
        return None

    def _refused(self, params: dict[str, str]) -> Refusal | None:
        type_name = params.get("InstanceType", "m1.small")
        subnet = params.get("SubnetId")
        for rule in self._refusals:
            if rule.type_name == type_name and rule.subnet_id in (None, subnet):
                # the draw happens only for matching calls, so a seed replays the same sequence
                hit = rule.probability >= 1.0 or self._rng.random() < rule.probability
                return rule if hit else None
        return None


_TIMESTAMP = re.compile(rb"<(\w*[Tt]ime)>(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z</\1>")


def shift_timestamps(body: bytes, seconds: float) -> bytes:
    """Move every `<...Time>ISO-8601</...Time>` element of an EC2 XML answer by `seconds`."""

    def shift(match: re.Match[bytes]) -> bytes:
        at = datetime.datetime.strptime(match[2].decode(), "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.UTC)
        moved = (at + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S").encode()
        return b"<%s>%s%sZ</%s>" % (match[1], moved, match[3] or b"", match[1])

    return _TIMESTAMP.sub(shift, body)


def http_date(epoch: float) -> str:
    """An HTTP `Date` header value (RFC 7231, GMT, whole seconds)."""
    return email.utils.formatdate(epoch, usegmt=True)


def _capacity_message(type_name: str, params: dict[str, str]) -> str:
    where = params.get("SubnetId") or params.get("Placement.AvailabilityZone") or "the region"
    return (
        f"We currently do not have sufficient {type_name} capacity in the Availability Zone you "
        f"requested ({where}). Our system will be working on provisioning additional capacity."
    )


def _refusal_message(code: str, type_name: str, params: dict[str, str]) -> str:
    """The message EC2 sends with a refusal `code` (the ones the lab injects; others are generic)."""
    if code == "VcpuLimitExceeded":
        return (
            "You have requested more vCPU capacity than your current vCPU limit of 0 allows for the instance "
            "bucket that the specified instance type belongs to. Please visit "
            "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit."
        )
    if code == "InsufficientFreeAddressesInSubnet":
        subnet = params.get("SubnetId", "")
        return f"There are not enough free addresses in subnet '{subnet}' to satisfy the requested number of instances."
    if code == "InsufficientInstanceCapacity":
        return _capacity_message(type_name, params)
    return f"{code}: {type_name} cannot be launched now."


_SCOPE = re.compile(r"Credential=[^/]+/\d+/([^/]+)/")


def _region(environ: WsgiEnviron) -> str:
    """The region a SigV4 request was signed for (us-east-1 when unsigned)."""
    found = _SCOPE.search(str(environ.get("HTTP_AUTHORIZATION", "")))
    return found.group(1) if found else "us-east-1"


def _set_params(environ: WsgiEnviron, updates: dict[str, str]) -> None:
    """Rewrite parameters of a form-encoded request (its body, read and put back) before the wrapped
    app reads it. Requests are unsigned as far as moto cares, so the signature does not matter."""
    if environ.get("REQUEST_METHOD") != "POST":
        pairs = [(k, updates.get(k, v)) for k, v in parse_qsl(environ.get("QUERY_STRING", ""), True)]
        environ["QUERY_STRING"] = urlencode(pairs)
        return
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    pairs = [(k, updates.get(k, v)) for k, v in parse_qsl(body.decode("utf-8", "replace"), True)]
    new = urlencode(pairs).encode()
    environ["wsgi.input"] = io.BytesIO(new)
    environ["CONTENT_LENGTH"] = str(len(new))


def _query_params(environ: WsgiEnviron) -> dict[str, str]:
    """The query-protocol parameters of a request (query string plus a form body), first values only.

    A form body is read and put back so that the wrapped app reads it unchanged."""
    raw = environ.get("QUERY_STRING", "")
    content_type = environ.get("CONTENT_TYPE", "")
    if environ.get("REQUEST_METHOD") == "POST" and content_type.startswith(
        "application/x-www-form-urlencoded"
    ):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        environ["CONTENT_LENGTH"] = str(len(body))
        raw = f"{raw}&{body.decode('utf-8', 'replace')}" if raw else body.decode("utf-8", "replace")
    return {key: values[0] for key, values in parse_qs(raw).items() if values}
