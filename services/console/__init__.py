"""The web console: a server-rendered operator and tenant UI over the admin APIs."""
