"""The deployable services, one package each (target, draft, router); each imports the library, never another."""
