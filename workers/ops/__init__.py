"""Operator commands' glue: health, migrations, the demo, moving a tenant between shards."""
