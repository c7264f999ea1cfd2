"""What the Computer and the sandbox launcher share: the on-disk layout, the private socket
and the launcher API's wire models (`launcher_wire`).

Standard library, uvicorn and pydantic only; it imports neither service.
"""
