# examples/readme_example.py — the README's Python example: a linear layer trained with Dion2.
import torch
from dion_cpp import Dion2

torch.manual_seed(0)
layer = torch.nn.Linear(64, 32)
x = torch.randn(256, 64)
y = torch.tanh(x @ torch.randn(64, 32) / 8)
opt = Dion2([{"params": [layer.weight]},                        # matrix: Dion2
             {"params": [layer.bias], "algorithm": "adamw"}],  # vector: AdamW
            lr=0.02, fraction=0.25)
losses = []
for step in range(30):
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(layer(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
print(f"dion2: loss {losses[0]:.4f} -> {losses[-1]:.4f}")
assert losses[-1] < losses[0], "the loss did not go down"
