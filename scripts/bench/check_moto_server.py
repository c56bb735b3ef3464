"""Checks that moto_server.py's projected read answers as moto's own does: both
`Item.project`s on random items (nested maps and lists, sets, missing attributes) and
random projection paths (nested keys, list indices, unknown names). Run with the venv's
Python: .venv/bin/python scripts/bench/check_moto_server.py
"""

import importlib.util
import os
import random

from moto.dynamodb.models.dynamo_type import DynamoType, Item

ORIGINAL = Item.project
HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("moto_server", os.path.join(HERE, "moto_server.py"))
spec.loader.exec_module(importlib.util.module_from_spec(spec))
PATCHED = Item.project
assert PATCHED is not ORIGINAL, "moto_server.py did not replace Item.project"

rng = random.Random(7)
NAMES = ["a", "b", "c", "a[1]", "ledger"]
HEADS = NAMES + ["a[0]", "a[1][0]", "zz", "ledger[2]", "pk"]
KEYS = ["k0", "k1", "k2", "k0[0]", "k1[1]"]


def value(depth):
    r = rng.random()
    if depth > 2 or r < 0.4:
        return rng.choice(
            [{"S": f"x{rng.randint(0, 9)}"}, {"N": str(rng.randint(0, 99))}, {"BOOL": True},
             {"NULL": True}, {"SS": ["a", "b"]}]
        )
    if r < 0.7:
        return {"M": {f"k{i}": value(depth + 1) for i in range(rng.randint(0, 4))}}
    return {"L": [value(depth + 1) for _ in range(rng.randint(0, 3))]}


def answer(project, item, paths):
    try:
        return project(item, paths).to_json()
    except Exception as e:  # the same error type counts as the same answer
        return ("error", type(e).__name__)


for _ in range(3000):
    attrs = {"pk": {"S": "p"}, "sk": {"S": "s"}}
    for name in rng.sample(NAMES, rng.randint(0, len(NAMES))):
        attrs[name] = value(0)
    item = Item(hash_key=DynamoType({"S": "p"}), range_key=DynamoType({"S": "s"}), attrs=attrs)
    paths = [
        [rng.choice(HEADS)] + [rng.choice(KEYS) for _ in range(rng.randint(0, 2))]
        for _ in range(rng.randint(1, 5))
    ]
    want, got = answer(ORIGINAL, item, paths), answer(PATCHED, item, paths)
    assert want == got, (attrs, paths, want, got)
print("moto_server.py's projection answered as moto's on 3000 random items")
