"""`hysync serve`: the long-running owner of a testbed's switch (server), who may use it
(auth, keys), its request protocol (requests, client), and its Prometheus metrics."""
