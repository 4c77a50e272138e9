"""What a hospital adds to its PyTorch training script to join a fedaudit federation.

    FEDAUDIT_URL=http://127.0.0.1:8000 FEDAUDIT_TOKEN=fa_c_... \
        python examples/hospital_client.py FEDERATION_ID

http://127.0.0.1:8000 is README's quickstart coordinator: plain http on loopback, for a site on
the same machine. A coordinator that sites reach over a network serves https, started with
``fedaudit serve --tls-cert ... --tls-key ...`` or behind a TLS-terminating proxy
(docs/deployment.md): then FEDAUDIT_URL is the ``https://...`` URL the operator gives.
The model and the data set below stand in for the site's own (here: scikit-learn's digits).
"""

import sys

import torch
from sklearn.datasets import load_digits
from torch import nn

from client_sdk import FederationClient, Participant

digits = load_digits()
dataset = torch.utils.data.TensorDataset(
    torch.tensor(digits.images[:, None] / 16.0, dtype=torch.float32),
    torch.tensor(digits.target, dtype=torch.long),
)
model = nn.Sequential(nn.Flatten(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))

# The ten lines a site needs: a client, a participant, run.
with FederationClient() as client:  # FEDAUDIT_URL and FEDAUDIT_TOKEN from the environment
    participant = Participant(client, sys.argv[1], model, dataset, state_dir="fedaudit-state")
    participant.run()  # trains on cuda when available, until the federation finishes
print("federation finished; the final global model is loaded in `model`")
