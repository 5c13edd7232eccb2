"""One router per resource: rank (stateless), sessions, recall/context, facts, operations."""
