"""What the client and the server share: the message formats and the sockets' security."""
