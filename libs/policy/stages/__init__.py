"""The stages of a scheduling pass (see docs/design-notes.md, "libs/policy: layout and stages")."""
