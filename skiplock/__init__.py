"""skiplock: a task queue that lives inside PostgreSQL.

The queue is the PL/pgSQL functions in schema `queue` (see schema/ and `\\df+ queue.*`); this
package only deploys them (Alembic), runs a throwaway dev cluster, the demo and the CLI.
"""

__version__ = "0.2.0"
