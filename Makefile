# The two commands: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test setup protos check-protos bench clean

# The exact tested versions come from constraints.txt; pyproject.toml holds the compatible ranges.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# Train PPO with Nitro boosting on Hopper-v5 through the real local system
# (Redis, the local Lambda endpoint, three gRPC services), then stop everything.
demo: setup
	$(BIN)/nitro train --local --env Hopper-v5 --preset tuned --scaler nitro --i-min 4 --i-max 16 \
		--rounds 80 --steps-per-actor 512 --eval-episodes 3 --budget 5 --seed 1

test: setup
	$(BIN)/python -m pytest

protos: setup
	$(BIN)/python -m nitro.tools.gen_protos

check-protos: setup
	$(BIN)/python -m nitro.tools.gen_protos --check

bench: setup
	$(BIN)/pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,bench]'
	for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .nitro results .pytest_cache
