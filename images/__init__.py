"""Encoded images: PNG/JPEG <-> numpy with decoders chosen by measurement, pixel limits and header checks."""
