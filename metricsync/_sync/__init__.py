"""The sync protocol: groups, the agreed layout, packing, the collectives (one
gather when steady, two all_reduces for large groups) and asynchronous syncs."""
