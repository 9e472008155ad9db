"""Alembic environment: always driven from ``sweeper.store.store.migrate`` with a connection."""

from alembic import context

from sweeper.store.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    version_table="sweeper_alembic_version",
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
