"""moto's server with DynamoDB Query on a table's own key reading only the queried
partition, and two more of its costs cut (below). Used by `scripts/bench.sh scale` and
`cpu-share` only; the tests run stock moto.

moto 5.2.5 answers a base-table Query by sorting every item of the table
(`Table.all_items()`) and then filtering on the partition key: 1.2 s per Query at
100,000 ledger rows on the benchmark machine, which made the moto process, not tgsync,
the whole wall time of a 1,000-group resync. Here `all_items()`, when called from such a
Query on the same thread, returns that partition's items in the same (sorted) order;
everything else (key conditions, filters, paging, limits, projections, errors) is moto's
own code.

Two more of moto's per-request costs that grow with what the bench stores, not with what
a request asks, are cut the same way (same answers, less work; found by sampling the
server's stacks during the CPU-share bench at 1,000 groups):
- a projected read (`ProjectionExpression`, as tgsync's batched state reads use) turned
  the *whole* item into plain JSON (a deep copy and a full decode) once per projected
  path, then kept the path: 9 paths of a group's ~12 KB item cost 9 decodes of its
  ledger, half of moto's time in the CPU-share bench at 1,000 groups. Here each path
  decodes only the top-level attribute it starts with; `find_nested_key` and
  `merge_dicts`, moto's own, still pick and merge the paths;
- every request listed moto's package directory (`list_of_moto_modules`: a listdir and
  ~150 isdir calls) under the dispatcher's lock to route it; here the list is read once.
`check_moto_server.py` (beside this file) compares the two projections on random items.
Usage: python moto_server.py [moto_server arguments].
"""

import threading

from botocore.utils import merge_dicts
from moto import backends
from moto.dynamodb.models import dynamo_type
from moto.dynamodb.models.dynamo_type import Item
from moto.dynamodb.models.table import Table
from moto.dynamodb.models.utilities import find_nested_key
from moto.server import main

_query = Table.query
_all_items = Table.all_items
_partition = threading.local()


def all_items(self):
    wanted = getattr(_partition, "key", None)
    if wanted is not None and wanted[0] is self:
        items = list(self.items.get(wanted[1], {}).values())
        return sorted(items, key=lambda x: x.range_key)
    return _all_items(self)


def query(self, hash_key, *args, **kwargs):
    index_name = kwargs.get("index_name", args[6] if len(args) > 6 else None)
    if index_name or not self.range_key_attr or hash_key is None:
        return _query(self, hash_key, *args, **kwargs)
    _partition.key = (self, hash_key)
    try:
        return _query(self, hash_key, *args, **kwargs)
    finally:
        _partition.key = None


def project(self, projection_expressions):
    # moto's Item.project, with each path's lookup given only the attributes it can start
    # at: `name` itself, or `name[i]…` (a list element of `name`).
    result = {}
    for expr in projection_expressions:
        head = expr[0]
        plain = {
            key: dynamo_type.deserializer.deserialize(value.to_regular_json())
            for key, value in self.attrs.items()
            if key == head or head.startswith(key + "[")
        }
        merge_dicts(result, find_nested_key(expr, plain))
    return Item(
        hash_key=self.hash_key,
        range_key=self.range_key,
        attrs=dynamo_type.serializer.serialize(result)["M"],
    )


_modules = list(backends.list_of_moto_modules())

Table.all_items = all_items
Table.query = query
Item.project = project
backends.list_of_moto_modules = lambda: iter(_modules)

if __name__ == "__main__":
    main()
