"""Tools around the services: the local cluster and its Redis, a gateway client, the built-in
model pairs (tiny, SmolLM2). They start services as processes and never import their code."""
