"""The starpulse node agent: collectors, simulation at the hardware edge, transport."""
