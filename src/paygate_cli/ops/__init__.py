"""Operator logic behind the commands: plain functions over db/ (and later chain/); no typer, no rich."""
