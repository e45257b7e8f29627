"""The jagged-type snippets of the TorchRec tutorial (seed 001) run unchanged with
`import rectoolkit as torchrec` and print what the tutorial shows."""

import contextlib
import io
import re
import sys
import textwrap

SNIPPET = '''
import torch
import rectoolkit as torchrec
from torchrec import JaggedTensor, KeyedJaggedTensor, KeyedTensor

# Batch Size 2
# 1 ID in example 1, 2 IDs in example 2
id_list_feature_lengths = torch.tensor([1, 2])
# Values (IDs) tensor: ID 5 is in example 1, ID 7, 1 is in example 2
id_list_feature_values = torch.tensor([5, 7, 1])
# Lengths can be converted to offsets for easy indexing of values
id_list_feature_offsets = torch.cumsum(id_list_feature_lengths, dim=0)
print("Offsets: ", id_list_feature_offsets)
print("First Batch: ", id_list_feature_values[: id_list_feature_offsets[0]])
print(
    "Second Batch: ",
    id_list_feature_values[id_list_feature_offsets[0] : id_list_feature_offsets[1]],
)
# ``JaggedTensor`` is just a wrapper around lengths/offsets and values tensors!
jt = JaggedTensor(values=id_list_feature_values, lengths=id_list_feature_lengths)
# Automatically compute offsets from lengths
print("Offsets: ", jt.offsets())
# Convert to list of values
print("List of Values: ", jt.to_dense())
# ``__str__`` representation
print(jt)
product_jt = JaggedTensor(
    values=torch.tensor([1, 2, 1, 5]), lengths=torch.tensor([3, 1])
)
user_jt = JaggedTensor(values=torch.tensor([2, 3, 4, 1]), lengths=torch.tensor([2, 2]))
kjt = KeyedJaggedTensor.from_jt_dict({"product": product_jt, "user": user_jt})
print("Keys: ", kjt.keys())
print("Lengths: ", kjt.lengths())
print("Values: ", kjt.values())
print("to_dict: ", kjt.to_dict())
print(kjt)
# The EmbeddingBagCollection's output, as its traced graph in the seed builds it:
# KeyedTensor(keys = ['product', 'user'], length_per_key = [64, 64], values = to_1, key_dim = 1)
result = KeyedTensor(keys=["product", "user"], length_per_key=[64, 64], values=torch.randn(2, 128), key_dim=1)
print(result.keys())
print(result.values().shape)
result_dict = result.to_dict()
for key, embedding in result_dict.items():
    print(key, embedding.shape)
'''

# Copied from the seed's output block (the seed's page dropped the indentation).
EXPECTED = """
Offsets: tensor([1, 3])
First Batch: tensor([5])
Second Batch: tensor([7, 1])
Offsets: tensor([0, 1, 3])
List of Values: [tensor([5]), tensor([7, 1])]
JaggedTensor({
[[5], [7, 1]]
})
Keys: ['product', 'user']
Lengths: tensor([3, 1, 2, 2])
Values: tensor([1, 2, 1, 5, 2, 3, 4, 1])
to_dict: {'product': <torchrec.sparse.jagged_tensor.JaggedTensor object at 0x7f17f9a8a230>, 'user': <torchrec.sparse.jagged_tensor.JaggedTensor object at 0x7f17f9a8bc10>}
KeyedJaggedTensor({
"product": [[1, 2, 1], [5]],
"user": [[2, 3], [4, 1]]
})
['product', 'user']
torch.Size([2, 128])
product torch.Size([2, 64])
user torch.Size([2, 64])
"""


def _normalize(text: str) -> list:
    text = re.sub(r"<[\w.]+\.(\w+) object at 0x[0-9a-f]+>", r"<\1>", text)
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def test_seed_001_jagged_snippets_print_the_tutorial_output(monkeypatch):
    import rectoolkit

    # The tutorial writes `from torchrec import JaggedTensor`: let that name resolve to rectoolkit.
    monkeypatch.setitem(sys.modules, "torchrec", rectoolkit)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(textwrap.dedent(SNIPPET), "seed_001", "exec"), {})
    assert _normalize(out.getvalue()) == _normalize(EXPECTED)


def test_seed_001_str_layout_is_exact():
    # The indentation the seed page lost, as TorchRec prints it.
    import torch

    import rectoolkit as torchrec

    jt = torchrec.JaggedTensor(values=torch.tensor([5, 7, 1]), lengths=torch.tensor([1, 2]))
    assert str(jt) == "JaggedTensor({\n    [[5], [7, 1]]\n})\n"
    kjt = torchrec.KeyedJaggedTensor.from_jt_dict(
        {
            "product": torchrec.JaggedTensor(values=torch.tensor([1, 2, 1, 5]), lengths=torch.tensor([3, 1])),
            "user": torchrec.JaggedTensor(values=torch.tensor([2, 3, 4, 1]), lengths=torch.tensor([2, 2])),
        }
    )
    assert str(kjt) == 'KeyedJaggedTensor({\n    "product": [[1, 2, 1], [5]],\n    "user": [[2, 3], [4, 1]]\n})\n'
