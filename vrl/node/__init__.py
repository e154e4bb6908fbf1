"""The network node: protocol state machine, messages, store, model work and the daemon."""
