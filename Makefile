# The two commands of the README, and their set-up. Everything runs in ./.venv.
VENV   ?= .venv
PY     := $(VENV)/bin/python
# torch and torchvision are installed first, as a pair (they install from local disk on our
# machines; an unpinned torch would pull a multi-GB build from elsewhere).
TORCH  := torch==2.14.1 torchvision==0.29.1
# Two workers on two cores: one math thread each, or torch oversubscribes the CPU many times over.
PYTEST := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadfile

.PHONY: demo test test-all install clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

# The main job on the embedded default: a tiny Qwen2.5-VL learns a Spatial-SSRL pretext (SFT warm
# start, then GRPO from the verifiable reward); prints held-out accuracy before and after and writes
# runs/demo/curves.png. One math thread: the tiny model is faster that way on 2 cores.
demo: install
	OMP_NUM_THREADS=1 $(VENV)/bin/mmrl train configs/spatial_ssrl/tiny_cpu.yaml --out runs/demo --overwrite

# The test suite without the slow learning runs, but with the shortest real learning check of every
# domain (`-m learning`: VLA PPO in MuJoCo; the VLM, text, data, driving and image-generation checks
# are fast enough for the default suite). `make test-all` runs every slow test too.
test: install
	$(PYTEST) -m "(not slow or learning) and not gpu"

test-all: install
	$(PYTEST) -m "not gpu"

clean:
	rm -rf runs build dist *.egg-info
