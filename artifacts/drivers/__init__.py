"""Object stores (S3, a local folder) behind one interface, and the copier that moves blobs between them."""
