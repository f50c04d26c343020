"""What every partq TCP and Unix socket speaks: frames (``frames``), errors in frames
(``error_frames``), the authenticated handshake (``handshake``) and the TCP listener with the
limits every partq listener keeps (``listener``)."""
