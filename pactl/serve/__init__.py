"""`pactl serve`: the model and a bundle loaded once, answering over HTTP on 127.0.0.1.

A thin layer over the same library calls as `pactl query` (pactl.verbs.query.open_query_model,
pactl.embed.embed_files, pactl.index.search.search/hits): this package owns loading once, batching
requests that arrive together into one forward pass, noticing a new generation of the bundle,
and HTTP. The web page it serves lives in pactl/static.

Modules: `config` (ServeConfig, what the command line resolves), `engine` (the loaded model and
bundle, the batcher), `app` (the FastAPI application and its guard), `client` (`pactl query
--server`, standard library only, so it needs no extra).
"""
