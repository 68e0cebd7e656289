"""Table definitions of the simulated MySQL ``shop`` database.

A :class:`TableSchema` is what a binlog reader knows about a table: its columns in order, each
with a MySQL column type, and its primary key. The writers derive every format's type metadata
(Canal ``mysqlType``/``sqlType``, Debezium schema fields, pipeline ``types:``) from these MySQL
types, so there is one place to change a column.

Example::

    schema = shop_tables()
    schema["orders"].pk                  # ('id',)
    schema["products"].column("price")   # Column(name='price', mysql_type='decimal(10,2)', ...)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

DATABASE = "shop"

_DECIMAL_RE = re.compile(r"^decimal\((\d+),(\d+)\)$")


@dataclass(frozen=True)
class Column:
    """One MySQL column: name, type as ``SHOW CREATE TABLE`` spells it, nullability."""

    name: str
    mysql_type: str
    nullable: bool = True

    @property
    def kind(self) -> str:
        """Value kind: ``int``, ``bigint``, ``decimal``, ``date``, ``datetime`` or ``string``."""
        t = self.mysql_type
        if t.startswith("bigint"):
            return "bigint"
        if t.startswith("int"):
            return "int"
        if t.startswith("decimal"):
            return "decimal"
        if t in ("date", "datetime"):
            return t
        return "string"

    @property
    def decimal_precision_scale(self) -> tuple[int, int]:
        """``(precision, scale)`` of a ``decimal(p,s)`` column.

        Raises:
            ValueError: the column is not a decimal.
        """
        m = _DECIMAL_RE.match(self.mysql_type)
        if not m:
            raise ValueError(f"column {self.name!r} is {self.mysql_type!r}, not decimal(p,s)")
        return int(m.group(1)), int(m.group(2))

    @property
    def spark_type(self) -> str:
        """The Spark SQL type a faithful replica uses for this column."""
        return {
            "bigint": "bigint", "int": "int", "date": "date", "datetime": "timestamp",
            "string": "string",
        }.get(self.kind) or self.mysql_type


@dataclass(frozen=True)
class TableSchema:
    """Columns (in table order) and primary key of one source table."""

    database: str
    name: str
    columns: tuple[Column, ...]
    pk: tuple[str, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"{self.database}.{self.name} has no column {name!r}")

    def with_column(self, column: Column) -> TableSchema:
        """A copy with ``column`` appended (``ALTER TABLE ... ADD COLUMN``)."""
        if column.name in self.column_names:
            raise ValueError(f"{self.name} already has column {column.name!r}")
        return replace(self, columns=(*self.columns, column))

    def create_sql(self) -> str:
        cols = [f"  `{c.name}` {c.mysql_type}{'' if c.nullable else ' NOT NULL'}"
                for c in self.columns]
        pk = ", ".join(f"`{k}`" for k in self.pk)
        body = ",\n".join([*cols, f"  PRIMARY KEY ({pk})"])
        return f"CREATE TABLE `{self.name}` (\n{body}\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"


# Added mid-history by ``ALTER TABLE customers ADD COLUMN loyalty_tier ...``.
LOYALTY_TIER = Column("loyalty_tier", "varchar(16)")


def shop_tables() -> dict[str, TableSchema]:
    """The four tables as they exist before any schema change."""
    def t(name: str, pk: tuple[str, ...], *cols: Column) -> TableSchema:
        return TableSchema(DATABASE, name, tuple(cols), pk)

    return {
        "customers": t(
            "customers", ("id",),
            Column("id", "int(11)", nullable=False),
            Column("email", "varchar(255)", nullable=False),
            Column("full_name", "varchar(100)"),
            Column("city", "varchar(64)"),
            Column("birth_date", "date"),
            Column("created_at", "datetime", nullable=False),
            Column("updated_at", "datetime", nullable=False),
        ),
        "products": t(
            "products", ("id",),
            Column("id", "int(11)", nullable=False),
            Column("sku", "varchar(32)", nullable=False),
            Column("name", "varchar(200)", nullable=False),
            Column("price", "decimal(10,2)", nullable=False),
            Column("stock", "int(11)", nullable=False),
            Column("created_at", "datetime", nullable=False),
            Column("updated_at", "datetime", nullable=False),
        ),
        "orders": t(
            "orders", ("id",),
            Column("id", "bigint(20)", nullable=False),
            Column("customer_id", "int(11)", nullable=False),
            Column("status", "varchar(16)", nullable=False),
            Column("amount", "decimal(10,2)", nullable=False),
            Column("note", "text"),
            Column("created_at", "datetime", nullable=False),
            Column("updated_at", "datetime", nullable=False),
        ),
        "order_items": t(
            "order_items", ("order_id", "line_no"),
            Column("order_id", "bigint(20)", nullable=False),
            Column("line_no", "int(11)", nullable=False),
            Column("product_id", "int(11)", nullable=False),
            Column("qty", "int(11)", nullable=False),
            Column("unit_price", "decimal(10,2)", nullable=False),
        ),
    }
