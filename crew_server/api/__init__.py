"""The crew server's HTTP API: one module per caller (computer, agent, user), the event
stream, the shared plumbing, and the route table (`routes.OPS`) the app and the OpenAPI
document are both built from."""
