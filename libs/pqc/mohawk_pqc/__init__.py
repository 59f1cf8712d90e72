"""mohawk_pqc: post-quantum secured channels, sealed envelopes, certificates and slice packages.

Knows nothing of models or the engine. Everything is built from the `cryptography` package
(OpenSSL: X25519, ML-KEM-768, ECDSA P-256, ML-DSA-65, HKDF-SHA256, AES-256-GCM), with liboqs as an
optional second ML-KEM provider.
"""
