"""``mmrl doctor``: which MuJoCo rendering backend works here, and how fast it renders.

Each backend is probed in a fresh subprocess (MuJoCo binds its OpenGL backend at import), rendering
the push scene at 64 and 128 px with the training camera settings (no shadows, no multisampling)
and with MuJoCo's defaults (4096 shadow map, 4× multisampling) for comparison.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from mmrl.envs.robot.rendering import BACKENDS, backend_library_found

DEFAULT_QUALITY = '<quality shadowsize="4096" offsamples="4"/>'
TRAINING_QUALITY = '<quality shadowsize="0" offsamples="0"/>'


def measure_fps(frames: int = 200) -> dict[str, float]:
    """Frames/s of the push scene at 64 and 128 px, with and without shadows (current backend)."""
    from mmrl.envs.robot.rendering import SceneRenderer, mujoco
    from mmrl.envs.robot.tabletop import mjcf_path

    xml = mjcf_path("push.xml").read_text()
    if TRAINING_QUALITY not in xml:
        raise ValueError("push.xml no longer holds the training <quality> element doctor replaces")
    results = {}
    for shadows, quality in (("no_shadows", TRAINING_QUALITY), ("shadows", DEFAULT_QUALITY)):
        model = mujoco.MjModel.from_xml_string(xml.replace(TRAINING_QUALITY, quality))
        data = mujoco.MjData(model)
        mujoco.mj_forward(model, data)
        camera = model.camera("top").id
        for size in (64, 128):
            renderer = SceneRenderer(model, size, size)
            renderer.render(model, data, camera)
            renderer.render(model, data, camera)
            start = time.perf_counter()
            for _ in range(frames):
                renderer.render(model, data, camera)
            results[f"fps_{size}px_{shadows}"] = frames / (time.perf_counter() - start)
            renderer.close()
    return results


def probe(backend: str, timeout: float = 120.0) -> dict:
    """Render with ``MUJOCO_GL=backend`` in a subprocess; {"ok": bool, "error" | fps keys}."""
    code = ("import json, sys\nfrom mmrl.envs.robot.doctor import measure_fps\n"
            "try:\n    print(json.dumps({'ok': True, **measure_fps()}))\n"
            "except Exception as err:\n    print(json.dumps({'ok': False, 'error': f'{type(err).__name__}: {err}'}))\n")
    env = {**os.environ, "MUJOCO_GL": backend, "PYOPENGL_PLATFORM": backend}
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"ok": False, "error": (out.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def diagnose() -> str:
    """The report ``mmrl doctor`` prints."""
    from mmrl.envs.robot.rendering import BACKEND

    from mmrl.envs.robot.rendering import USER_MUJOCO_GL

    lines = [f"MUJOCO_GL as set by the user: {USER_MUJOCO_GL or '(unset)'}",
             f"backend mmrl uses in this process: {BACKEND or '(none found)'}"]
    working = []
    for backend in BACKENDS:
        found = backend_library_found(backend)
        result = probe(backend)
        status = "works" if result["ok"] else f"fails: {result['error']}"
        lines.append(f"  {backend:<7} library {'found' if found else 'not found'}; rendering {status}")
        if result["ok"]:
            working.append(backend)
            lines += [f"      {key.removeprefix('fps_').replace('_', ' ')}: {value:,.0f} frames/s"
                      for key, value in result.items() if key.startswith("fps_")]
    if working:
        lines.append(f"OK: rendering works with MUJOCO_GL={working[0]} (training cameras: no shadows, no "
                     f"multisampling)")
    else:
        lines.append("ERROR: no backend renders. Install Mesa's EGL (libegl1) or OSMesa (apt-get install "
                     "libosmesa6) and set MUJOCO_GL=egl or MUJOCO_GL=osmesa")
    return "\n".join(lines)
