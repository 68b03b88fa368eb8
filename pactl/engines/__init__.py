"""Past one machine on an existing engine: `--engine ray` runs `pactl embed` and `pactl index`
as one Ray task per shard (pactl.engines.embedding, pactl.engines.indexing), each writing what
the same verb writes here; pactl.engines.cluster joins or starts the cluster and turns a task's
failure into one line. Nothing here imports Ray until a verb asks for it."""
