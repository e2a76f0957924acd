"""Headless MuJoCo rendering: pick a working OpenGL backend, say which, render many envs cheaply.

MuJoCo chooses its OpenGL backend once, when ``mujoco`` is first imported, from ``MUJOCO_GL``.
With ``MUJOCO_GL`` unset offscreen rendering fails on a server, so :func:`select_backend` (run
when ``mmrl.envs.robot`` is imported, before it imports mujoco) sets it: EGL when ``libEGL`` is
found, else OSMesa when ``libOSMesa`` is found. A value the user set is kept. The first render
logs the backend in use (``mmrl doctor`` prints full diagnostics).

:class:`SceneRenderer` owns one GL context, one ``MjrContext`` and one scene per (MJCF file,
image size) in a process, and draws any env built from that file with the env's own
``MjModel``/``MjData`` (colours live in each env's model). One context instead of one per env
avoids a context switch per frame and ~60 ms of set-up per env.
"""

from __future__ import annotations

import ctypes.util
import importlib
import importlib.util
import logging
import os
import sys

import numpy as np

BACKENDS = ("egl", "osmesa")
USER_MUJOCO_GL = os.environ.get("MUJOCO_GL")  # as the user set it, before select_backend
HINT = ("set MUJOCO_GL=egl (needs libEGL; works with Mesa's software renderer) or MUJOCO_GL=osmesa "
        "(apt-get install libosmesa6) before Python starts; run `mmrl doctor` for diagnostics")
log = logging.getLogger("mmrl.envs.robot")


class RendererUnavailableError(RuntimeError):
    """No OpenGL backend could render offscreen; the message names the ``MUJOCO_GL`` options."""


def backend_library_found(backend: str) -> bool:
    name = {"egl": "EGL", "osmesa": "OSMesa"}[backend]
    return ctypes.util.find_library(name) is not None


def select_backend() -> str:
    """``MUJOCO_GL`` as the user set it, else the first of EGL, OSMesa whose library exists.

    Sets ``os.environ["MUJOCO_GL"]`` when it chooses. Returns the backend name ("" when none was
    found: rendering will then raise :class:`RendererUnavailableError`).
    """
    chosen = os.environ.get("MUJOCO_GL", "").strip().lower()
    if chosen:
        return chosen
    for backend in BACKENDS:
        if backend_library_found(backend):
            if "mujoco" in sys.modules:
                log.warning("mujoco was imported before mmrl.envs.robot with MUJOCO_GL unset; set "
                            "MUJOCO_GL=%s before importing mujoco", backend)
                return ""
            os.environ["MUJOCO_GL"] = backend
            os.environ.setdefault("PYOPENGL_PLATFORM", backend)
            return backend
    return ""


BACKEND = select_backend()

try:
    import mujoco  # noqa: E402  (after select_backend: mujoco reads MUJOCO_GL at import)
except Exception as _err:  # an invalid MUJOCO_GL (RuntimeError), a backend whose GL library fails to load
    raise RendererUnavailableError(f"mujoco could not start with MUJOCO_GL={os.environ.get('MUJOCO_GL')!r}: "
                                   f"{_err}; {HINT}") from _err

_announced = False


def _load_llvm_users_first() -> None:
    """Import triton (torch's compiler; it bundles its own LLVM) before the first GL context.

    Mesa's software renderer (llvmpipe, behind EGL/OSMesa here) loads the system LLVM; importing
    triton *after* that segfaults the process (measured: render, then ``import triton``). In the
    other order both work, so the renderer loads triton first when it is installed.
    """
    if importlib.util.find_spec("triton") is not None:
        importlib.import_module("triton")


_load_llvm_users_first()  # at import: also protects mujoco.Renderer contexts made after importing mmrl.envs


class SceneRenderer:
    """Offscreen RGB renderer shared by every env built from one MJCF file at one image size."""

    def __init__(self, model: mujoco.MjModel, width: int, height: int):
        global _announced
        if model.vis.global_.offwidth < width or model.vis.global_.offheight < height:
            raise ValueError(f"image {width}x{height} exceeds the MJCF offscreen buffer "
                             f"{model.vis.global_.offwidth}x{model.vis.global_.offheight}: raise "
                             f"<visual><global offwidth offheight> in the MJCF")
        try:
            self.gl = mujoco.GLContext(width, height)
            self.gl.make_current()
            self.context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150)
        except Exception as err:  # ImportError, RuntimeError, mujoco.FatalError: all mean "no GL"
            raise RendererUnavailableError(f"MuJoCo offscreen rendering failed with MUJOCO_GL="
                                           f"{os.environ.get('MUJOCO_GL', '(unset)')!r}: {err}; {HINT}") from err
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.context)
        self.scene = mujoco.MjvScene(model, maxgeom=200)
        self.option = mujoco.MjvOption()
        self.camera = mujoco.MjvCamera()
        self.rect = mujoco.MjrRect(0, 0, width, height)
        self.width, self.height = width, height
        if not _announced:
            _announced = True
            log.info("MuJoCo rendering with MUJOCO_GL=%s", os.environ.get("MUJOCO_GL"))

    def close(self) -> None:
        """Free the GL objects in this renderer's own context: ``MjrContext`` frees buffer ids of
        whichever context is current, and another renderer's may share those ids."""
        if self.context is not None:
            self.gl.make_current()
            self.context.free()
            self.context = None
            self.gl.free()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: GL may already be gone
            pass

    def render(self, model: mujoco.MjModel, data: mujoco.MjData, camera_id: int) -> np.ndarray:
        """RGB image [H, W, 3] uint8 of ``data`` seen from fixed camera ``camera_id``."""
        self.camera.type = mujoco.mjtCamera.mjCAMERA_FIXED
        self.camera.fixedcamid = camera_id
        mujoco.mjv_updateScene(model, data, self.option, None, self.camera, mujoco.mjtCatBit.mjCAT_ALL, self.scene)
        if self.context is None:
            raise RuntimeError("render called after close()")
        self.gl.make_current()
        mujoco.mjr_render(self.rect, self.scene, self.context)
        rgb = np.empty((self.height, self.width, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(rgb, None, self.rect, self.context)
        return rgb[::-1].copy()  # OpenGL rows run bottom-up


_RENDERERS: dict[tuple[str, int, int], SceneRenderer] = {}


def shared_renderer(key: str, model: mujoco.MjModel, width: int, height: int) -> SceneRenderer:
    """The process's renderer for MJCF ``key`` at ``width`` x ``height`` (created on first use)."""
    if (key, width, height) not in _RENDERERS:
        _RENDERERS[key, width, height] = SceneRenderer(model, width, height)
    return _RENDERERS[key, width, height]
