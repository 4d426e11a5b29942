"""Pure detectors with no clock and no I/O: change points, trends, saturation, servable context and SLOs."""
