"""warcore-sglang under prefill/decode disaggregation (docs/sglang-pd.md).

Installed at the end of each PD scheduler's ``Scheduler.__init__`` (sglang has imported its
disaggregation modules there: ``init_disaggregation`` builds the queues and the connector),
checked against the release's rows first (:data:`FUNCTIONS`), patched through the
activation's patcher (put back when warcore comes off):

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from warcore.integration.engine_code import ShapeMismatch, check_functions

from ..audit import observe as _observe
from . import _state

__all__ = ["FUNCTIONS", "MARK", "Transfer", "install"]

S = "sglang.srt."
CONN = S + "disaggregation.mooncake.conn"
DECODE = S + "disaggregation.decode"
MARK = b"warcore-sglang-active"
"""The trailing frame of a decode side's KV-args registration where warcore is active."""
FRAMES = 20
"""The frames sglang 0.5.23's registration message has (``build_receiver_registration_message``)."""

FUNCTIONS: dict[str, dict[str, dict[str, tuple[str, str]]]] = {
    "0.5.23": {
        CONN: {
            # patched: the decode side's registration (marked), the prefill side's parse of it
            # (remembered) and its layout verdict (refused without the mark)
            "MooncakeKVManager.build_receiver_registration_message": (
                "(self)",
                "22ca6e271467217d",
            ),
            "KVArgsRegisterInfo.from_zmq": ("(cls, msg)", "d282f51ec226ac8e"),
            "MooncakeKVManager._validate_peer_state_layout": (
                "(self, registration_info)",
                "3d79183a2b900a8f",
            ),
            # relied on: a reason recorded per session, logged once at registration, and each
            # transfer to that session concluded failed with it
            "MooncakeKVManager._publish_peer_registration": (
                "(self, mooncake_session_id, decode_kv_args)",
                "1a72ba8c1fe50df9",
            ),
            "MooncakeKVManager.transfer_worker": (
                "(self, queue, executor, staging_buffer=None, worker_index=0)",
                "1aa87811a6825f86",
            ),
        },
        DECODE: {
            # patched: where the slots' indices leave for the transfer engine
            "DecodePreallocQueue._send_kv_metadata": (
                "(self, decode_req, kv_indices, page_size, state_indices=None, **metadata_kwargs)",
                "685113ba6198efdb",
            ),
            # relied on: allocates the slots and the row, then calls it
            "DecodePreallocQueue.pop_preallocated": (
                "(self, rids_to_check=None, pp_good_rids=None, pp_bad_rids=None)",
                "64b33a0adf9698a7",
            ),
        },
    },
}
"""Per audited release: the sglang functions this module patches or relies on (signature,
digest: :mod:`warcore.integration.engine_code`). A release without rows gets neither patch,
said in one line."""

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
    if mode not in ("prefill", "decode") or not _A.installed:
        return
    rows = FUNCTIONS.get(_A.version)
    if rows is None:
        _state.log_once(
            ("pd-unaudited", _A.version),
            logging.WARNING,
            f"warcore-sglang: PD on sglang {_A.version}: its disaggregation path was not "
            "audited; no transfer order nor pairing check (docs/sglang-pd.md)",
        )
        return
    done = []
    try:
        if mode == "decode":
            _patch_decode(rows)
            done.append("the transfer order")
        if CONN in sys.modules:  # the Mooncake backend (its connector is imported for it only)
            _patch_pairing(rows, mode)
            done.append("the pairing check (Mooncake)")
    except ShapeMismatch as exc:
        _A.take_off(exc.check, exc.detail)
        return
    log.info(
        "warcore-sglang: process %d is the %s side of a PD pair: %s",
        os.getpid(),
        mode,
        " and ".join(done) or "no transfer backend warcore pairs with",
    )


def _checked(rows: dict[str, dict[str, tuple[str, str]]], module_name: str) -> Any:
    module = sys.modules[module_name]
    check_functions(module, rows[module_name], _A.version)
    return module


def _patch_decode(rows: dict[str, dict[str, tuple[str, str]]]) -> None:
    queue = _checked(rows, DECODE).DecodePreallocQueue
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


def _patch_pairing(rows: dict[str, dict[str, tuple[str, str]]], mode: str) -> None:
    conn = _checked(rows, CONN)
    manager, info = conn.MooncakeKVManager, conn.KVArgsRegisterInfo
    if mode == "decode":
        build = vars(manager)["build_receiver_registration_message"]
        _A.patcher.set(manager, "build_receiver_registration_message", _marked(build))
        return
    parse = vars(info)["from_zmq"]
    _A.patcher.set(info, "from_zmq", classmethod(_remembered(parse.__func__)))
    validate = vars(manager)["_validate_peer_state_layout"]
    _A.patcher.set(manager, "_validate_peer_state_layout", _refusing(validate))


def _marked(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def build_receiver_registration_message(self: Any) -> Any:
        return [*original(self), MARK]

    return build_receiver_registration_message


_PEER = "_warcore_sglang_peer"


def _remembered(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def from_zmq(cls: Any, msg: Any) -> Any:
        info = original(cls, msg)
        setattr(info, _PEER, len(msg) > FRAMES and msg[-1] == MARK)
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
