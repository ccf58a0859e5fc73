# The two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-nitro test test-fast docs setup protos check-protos bench clean

# The exact tested versions come from constraints.txt; pyproject.toml holds the compatible ranges.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# Train PPO on Hopper-v5 with the default scaler (examples/demo.yaml) through the real local system (Redis, the
# local Lambda endpoint, three gRPC services), stop it, then evaluate the best policy on 10 episodes, record one, and
# write results/<job>/summary.md: the return against a random policy on the same episodes and against
# Stable-Baselines3's PPO at the same env steps (DEMO_REFERENCE, measured by bench/sb3_reference.py), and both costs.
# bench/demo_outcome.py measures what this gives; `make demo-nitro` is the same job with the paper's boosting scaler.
DEMO_JOB := demo-$(shell date +%Y%m%d-%H%M%S)
DEMO_FLAGS ?=
DEMO_REFERENCE := docs/results/evidence/sb3-ppo-default-hopper-v5.json
demo: setup
	$(BIN)/nitro train --local --config examples/demo.yaml --job-id $(DEMO_JOB) $(DEMO_FLAGS)
	$(BIN)/nitro eval results/$(DEMO_JOB)/best.pt --episodes 10 --seed 10000 --video results/$(DEMO_JOB)/best.mp4 \
	  --vs-random --reference $(DEMO_REFERENCE) --summary results/$(DEMO_JOB)/summary.md

demo-nitro: DEMO_FLAGS = --scaler nitro --i-min 4 --i-max 16
demo-nitro: demo

# Two workers (pytest-xdist): most tests wait on the processes they start, so one worker leaves a core idle.
# --dist loadfile keeps a module's tests, and the local system its fixtures start, on one worker.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile

# While developing: the suite less its `system` and `slow` tests (the rule: tests/conftest.py), in under two
# minutes on two cores; `make test` (CI: .ci/run) runs every test.
test-fast: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not system and not slow"

# The documentation site over docs/ (mkdocs.yml), with the API reference from the docstrings, at http://127.0.0.1:8000.
docs: setup
	$(BIN)/mkdocs serve

protos: setup
	$(BIN)/python -m nitro.tools.gen_protos

check-protos: setup
	$(BIN)/python -m nitro.tools.gen_protos --check

bench: setup
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,bench]'
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .nitro results .pytest_cache site
