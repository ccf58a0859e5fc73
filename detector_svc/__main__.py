import os

# Idle OpenMP threads must sleep, not spin: with spinning, torch's intra-op threads collapse
# when other processes (actors, the detector, evaluation) share the cores. Set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from detector_svc.server import main  # noqa: E402

main()
