"""What the Computer and the sandbox launcher share: the on-disk layout and the private socket.

Standard library and uvicorn only; it imports neither service.
"""
