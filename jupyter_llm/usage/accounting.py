"""Pure accounting: one finished request (``Sample``) added to running
``Totals``, and the figures shown from them. No clock, no I/O: the store
and the tests hand in plain values.

Device-seconds: the seconds a request held a slot on a loaded model (from
the slot being granted to the request's end, queueing and loading not
included) times the number of devices holding part of that model (a GPU,
or the CPU's memory). A model split over two GPUs for 3 s counts 6
device-seconds; the same model on one GPU counts 3.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Sample:
    """One request that held a slot, as ``api.generation`` saw it end."""

    model: str
    prompt_tokens: int = 0
    generated_tokens: int = 0
    first_token_s: float | None = None  # from the request to its first token; None: none came
    decode_s: float = 0.0  # the runner's eval_duration
    held_s: float = 0.0  # the slot held, start to end
    devices: int = 1  # devices holding part of the model


@dataclass(frozen=True, slots=True)  # slots: the table holds up to 260,000 of them
class Totals:
    """What some requests used, summed."""

    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    first_token_s: float = 0.0  # summed over the requests that got a first token
    first_tokens: int = 0  # how many did
    decode_s: float = 0.0
    device_s: float = 0.0


def device_seconds(held_s: float, devices: int) -> float:
    """The device-seconds of a slot held ``held_s`` on a model over ``devices`` devices."""
    return max(0.0, held_s) * max(1, devices)


def added(totals: Totals, sample: Sample) -> Totals:
    """``totals`` with ``sample`` counted in."""
    got_first = sample.first_token_s is not None
    return replace(
        totals,
        requests=totals.requests + 1,
        prompt_tokens=totals.prompt_tokens + max(0, sample.prompt_tokens),
        generated_tokens=totals.generated_tokens + max(0, sample.generated_tokens),
        first_token_s=totals.first_token_s + (max(0.0, sample.first_token_s or 0.0)),
        first_tokens=totals.first_tokens + int(got_first),
        decode_s=totals.decode_s + max(0.0, sample.decode_s),
        device_s=totals.device_s + device_seconds(sample.held_s, sample.devices),
    )


def tokens_per_second(totals: Totals) -> float | None:
    """Generated tokens over decode time; None before any decoding was timed."""
    if totals.decode_s <= 0 or totals.generated_tokens <= 0:
        return None
    return totals.generated_tokens / totals.decode_s


def mean_first_token(totals: Totals) -> float | None:
    """The mean time to first token; None when no request got one."""
    return totals.first_token_s / totals.first_tokens if totals.first_tokens else None


def figures(totals: Totals) -> dict[str, float | int | None]:
    """``totals`` as the route's JSON shows them (seconds, rounded to ms)."""
    rate = tokens_per_second(totals)
    first = mean_first_token(totals)
    return {
        "requests": totals.requests,
        "prompt_tokens": totals.prompt_tokens,
        "generated_tokens": totals.generated_tokens,
        "tokens_per_second": None if rate is None else round(rate, 2),
        "time_to_first_token": None if first is None else round(first, 3),
        "decode_seconds": round(totals.decode_s, 3),
        "device_seconds": round(totals.device_s, 3),
    }


def visible_users(asker: str, admin: bool, asked: str | None) -> str | None:
    """Whose rows ``asker`` reads: one user's name, or None for everyone
    (admins only). A ``PermissionError`` when a non-admin asks for another."""
    if asked is None:
        return None if admin else asker
    if asked != asker and not admin:
        raise PermissionError("only an admin may read another user's usage")
    return asked
