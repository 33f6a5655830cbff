"""Small shared utilities with no project imports: process helpers, the async-resource
shape, the pausable timer and the package version."""
