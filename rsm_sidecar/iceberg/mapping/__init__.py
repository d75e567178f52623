"""The table: its row schema, its evolution, and raw records -> rows of that schema."""
