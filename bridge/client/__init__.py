"""The client side of the bridge: what Isaac Sim (or any script) calls to send jobs and follow them."""
