"""warcore-sglang under prefill/decode disaggregation (docs/sglang-pd.md).

Installed at the end of each PD scheduler's ``Scheduler.__init__`` (sglang has imported its
disaggregation modules there: ``init_disaggregation`` builds the queues and the connector),
each part checked first against the entry of the release in force (its rows of
:data:`~warcore_sglang.releases.TRANSFER_ORDER` and :data:`~warcore_sglang.releases.PAIRING`,
and its structural checks of their modules; a part whose rows the release lacks is off, said
with the entry's ``lacks``), patched through the activation's patcher (put back when warcore
comes off):

* **The transfer order** (decode side, any transfer backend): the KV slots a new request is
  given may be slots the forward still in flight reads and writes: in the overlap loop a
  request that finished at step N-1 is still in the batch of step N (its redundant forward),
  and step N-1's result processing frees its slots and its row while N runs. sglang orders the
  schedule stream's later writes (the ``req_to_token`` rows) behind N with the WAR barrier; the
  transfer engine writes the KV slots from the prefill side, on no stream. warcore makes the
  decode side hand the slots' indices to the transfer engine (``_send_kv_metadata``) only once
  the forward in flight has finished (the forward stream synchronized; nothing in flight, no
  wait).
* **The pairing** (Mooncake): a decode side with warcore active marks its KV-args
  registration with one trailing frame (:data:`MARK`; sglang reads the frames it knows by
  index, so a prefill side without warcore ignores it); a prefill side with warcore active
  rejects a peer whose registration lacks it through sglang's own layout rejection
  (``_validate_peer_state_layout``'s reason: sglang logs it once at registration and fails
  each request routed to that peer with it).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from warcore.integration.checks import ReturnsList
from warcore.integration.engine_code import ShapeMismatch

from ..audit import observe as _observe
from ..releases import CONN, PAIRING, REGISTRATION, TRANSFER_ORDER, SglangRelease
from . import _state

__all__ = ["MARK", "Transfer", "frames", "install"]

MARK = b"warcore-sglang-active"
"""The trailing frame of a decode side's KV-args registration where warcore is active."""

_A = _state.activation
log = logging.getLogger("warcore.sglang")


@dataclass(frozen=True)
class Transfer:
    """A decode side handing a request's KV slots to the transfer engine."""

    scheduler: Any
    rid: str
    slots: Any
    """The slot indices handed out (sglang's ``kv_indices``, before paging)."""
    in_flight: bool
    """A forward was launched and its result not processed yet."""
    waited: bool
    """warcore waited for that forward before the indices left."""


def _mode(scheduler: Any) -> str:
    mode = getattr(scheduler, "disaggregation_mode", None)
    return str(getattr(mode, "value", mode) or "null")


def install(scheduler: Any) -> None:
    """The PD patches for this scheduler's side (nothing outside PD)."""
    mode = _mode(scheduler)
    state = _state.current
    if mode not in ("prefill", "decode") or not _A.installed or state is None:
        return
    release = state.release
    parts: list[tuple[str, str | None]] = []
    try:
        if mode == "decode":
            why = _lacking(release, *TRANSFER_ORDER)
            if why is None:
                _patch_decode()
            parts.append(("the transfer order", why))
        if CONN in sys.modules:  # the Mooncake backend (its connector is imported for it only)
            why = _lacking(release, *PAIRING)
            if why is None:
                _patch_pairing(release, mode)
            parts.append(("the pairing check (Mooncake)", why))
    except ShapeMismatch as exc:
        _A.take_off(exc.check, exc.detail)
        return
    on = [name for name, why in parts if why is None]
    said = [" and ".join(on)] if on else []
    off = [f"without {name}: {why}" for name, why in parts if why is not None]
    log.log(
        logging.WARNING if off else logging.INFO,
        "warcore-sglang: process %d is the %s side of a PD pair: %s",
        os.getpid(),
        mode,
        "; ".join(said + off) or "no transfer backend warcore pairs with",
    )


def _lacking(release: SglangRelease, module: str, qualnames: Sequence[str]) -> str | None:
    """Why ``release`` runs without the part relying on these rows: the first row its entry
    lacks, with what its ``lacks`` says of it; ``None`` where it has them all."""
    rows = release.functions_of(module)
    for qualname in qualnames:
        if qualname not in rows:
            said = release.lacks.get(f"{module}:{qualname}", "its entry has no row of it")
            return f"sglang {release.version} lacks {qualname} ({said})"
    return None


def _checked(module_name: str) -> Any:
    """The module, once its rows and structural checks in the entry in force passed."""
    module = sys.modules[module_name]
    _A.check_module(module)
    return module


def frames(release: SglangRelease) -> int:
    """The frames ``release``'s registration message has (its entry's :class:`ReturnsList`)."""
    for check in release.checks.get(CONN, ()):
        if isinstance(check, ReturnsList) and check.function == REGISTRATION:
            return check.length
    raise ShapeMismatch(REGISTRATION, f"sglang {release.version}'s entry has no frame count")


def _patch_decode() -> None:
    queue = _checked(TRANSFER_ORDER[0]).DecodePreallocQueue
    original = vars(queue)["_send_kv_metadata"]
    _A.patcher.set(queue, "_send_kv_metadata", _ordered_send(original))


def _ordered_send(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _send_kv_metadata(
        self: Any, decode_req: Any, kv_indices: Any, *args: Any, **kw: Any
    ) -> Any:
        scheduler = self.scheduler
        in_flight = bool(getattr(scheduler, "result_queue", None))
        # the slots may be the in-flight forward's (freed by the previous step's result
        # processing while it runs): the transfer engine writes them on no stream
        waited = in_flight and _wait_for_forward(scheduler)
        if _observe.listening():
            rid = str(getattr(decode_req.req, "rid", "?"))
            _observe.transfer(Transfer(scheduler, rid, kv_indices, in_flight, waited))
        return original(self, decode_req, kv_indices, *args, **kw)

    return _send_kv_metadata


def _wait_for_forward(scheduler: Any) -> bool:
    """The host waits for the forward stream (a device's streams; the device itself where its
    streams cannot be waited for alone, as the CPU's); whether it did. A failure is said once
    and the indices leave as sglang sends them."""
    try:
        stream = scheduler.forward_stream
        wait = getattr(stream, "synchronize", None) or scheduler.device_module.synchronize
        wait()
        return True
    except Exception as exc:
        unordered = "the indices leave unordered, as sglang sends them"
        _state.log_failure(("pd-wait",), "waiting for the forward in flight", exc, unordered)
        return False


def _patch_pairing(release: SglangRelease, mode: str) -> None:
    conn = _checked(CONN)
    manager, info = conn.MooncakeKVManager, conn.KVArgsRegisterInfo
    if mode == "decode":
        build = vars(manager)["build_receiver_registration_message"]
        _A.patcher.set(manager, "build_receiver_registration_message", _marked(build))
        return
    parse = vars(info)["from_zmq"]
    _A.patcher.set(info, "from_zmq", classmethod(_remembered(parse.__func__, frames(release))))
    validate = vars(manager)["_validate_peer_state_layout"]
    _A.patcher.set(manager, "_validate_peer_state_layout", _refusing(validate))


def _marked(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def build_receiver_registration_message(self: Any) -> Any:
        return [*original(self), MARK]

    return build_receiver_registration_message


_PEER = "_warcore_sglang_peer"


def _remembered(original: Callable[..., Any], frames: int) -> Callable[..., Any]:
    @functools.wraps(original)
    def from_zmq(cls: Any, msg: Any) -> Any:
        info = original(cls, msg)
        setattr(info, _PEER, len(msg) > frames and msg[-1] == MARK)
        return info

    return from_zmq


def _refusing(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _validate_peer_state_layout(self: Any, registration_info: Any) -> Any:
        if getattr(registration_info, _PEER, True):
            return original(self, registration_info)
        return False, refusal(registration_info)

    return _validate_peer_state_layout


def refusal(info: Any) -> str:
    """The one line a prefill side with warcore says of a decode peer without it."""
    return (
        f"warcore-sglang: decode peer {info.endpoint}:{info.dst_port} (tp rank "
        f"{info.dst_tp_rank}, mooncake session {info.mooncake_session_id}) does not have warcore "
        "active, this prefill server does: pairing refused (its transfers into the decode KV "
        "pool would not be ordered behind the forward in flight there; start the decode "
        "server with WARCORE_SGLANG=1, docs/sglang-pd.md)"
    )
