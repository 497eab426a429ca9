"""A user's own module named `worker`, beside their training script (train.py): HySync's
parts live under `hysync`, so this one must not hide any of them."""

ROLE = "the user's worker.py"
