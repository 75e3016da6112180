"""Costs: profile types and files (types, io), the roofline model (roofline, calibrate), and measurement of
present accelerators through the one op registry (measure). Import the submodules; this package imports
nothing heavy so that ``import port`` and the CLI start fast."""
