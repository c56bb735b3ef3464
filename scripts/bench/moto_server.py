"""moto's server with DynamoDB Query on a table's own key reading only the queried
partition. Used by `scripts/bench.sh scale` only; the tests run stock moto.

moto 5.2.5 answers a base-table Query by sorting every item of the table
(`Table.all_items()`) and then filtering on the partition key: 1.2 s per Query at
100,000 ledger rows on the benchmark machine, which made the moto process, not tgsync,
the whole wall time of a 1,000-group resync. Here `all_items()`, when called from such a
Query on the same thread, returns that partition's items in the same (sorted) order;
everything else (key conditions, filters, paging, limits, projections, errors) is moto's
own code. Usage: python moto_server.py [moto_server arguments].
"""

import threading

from moto.dynamodb.models.table import Table
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


Table.all_items = all_items
Table.query = query

if __name__ == "__main__":
    main()
