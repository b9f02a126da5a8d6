#!/usr/bin/env python3
"""The sample database of the db-streaming pipeline (stdlib sqlite3 only).

    python3 make_db.py [PATH]           create PATH (default: shop.db next to this file)
                                        with two tables and a few rows, if missing
    python3 make_db.py [PATH] --change  then, as "the application": an order placed, a
                                        customer's email updated, a customer deleted,
                                        a row REPLACEd, in four transactions
"""
import os
import sqlite3
import sys

here = os.path.dirname(os.path.abspath(__file__))
args = [a for a in sys.argv[1:] if not a.startswith("--")]
path = args[0] if args else os.path.join(here, "shop.db")

db = sqlite3.connect(path, timeout=30, isolation_level=None)
db.executescript(
    """
    PRAGMA journal_mode = WAL;
    CREATE TABLE IF NOT EXISTS customers(
        id INTEGER PRIMARY KEY, email TEXT UNIQUE NOT NULL, name TEXT);
    CREATE TABLE IF NOT EXISTS orders(
        id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL, item TEXT, qty INTEGER,
        placed_ms INTEGER);
    INSERT OR IGNORE INTO customers VALUES
        (1, 'ada@example.com', 'Ada'), (2, 'bob@example.com', 'Bob'),
        (3, 'cy@example.com', 'Cy');
    INSERT OR IGNORE INTO orders VALUES
        (100, 1, 'tea', 2, 0), (101, 2, 'cake', 1, 0);
    """
)
if "--change" in sys.argv:
    db.execute("INSERT INTO orders(customer_id, item, qty, placed_ms) VALUES (3, 'jam', 4, 0)")
    db.execute("UPDATE customers SET email = 'ada@lovelace.dev' WHERE id = 1")
    db.execute("DELETE FROM customers WHERE id = 2")
    db.execute("REPLACE INTO customers VALUES (3, 'cy@example.com', 'Cyrus')")
db.close()
print(path)
