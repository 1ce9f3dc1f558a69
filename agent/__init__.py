"""The campaign: manifest, state machine, lineage, scoring, proposers, report and the CLI."""
