//! Unit tests of the cluster map and its changes: the invariants every
//! applied map keeps and the deterministic rejections.

use super::*;

fn id(nonce: u64) -> ProposalId {
    ProposalId { server: 0, nonce }
}

fn change(map: &mut ClusterMap, change: Change) -> Applied {
    let mut machine = Machine {
        map: map.clone(),
        recent: VecDeque::new(),
    };
    let expected_epoch = map.epoch;
    let applied = machine.apply(&Command::Change {
        change,
        expected_epoch,
        id: id(expected_epoch),
    });
    *map = machine.map;
    applied
}

/// Take `server` out of `set` (a change that must apply).
fn remove_member(map: &mut ClusterMap, set: u16, server: u16) {
    change(
        map,
        Change::RemoveMember {
            set,
            server: ServerId(server),
        },
    )
    .unwrap();
}

#[test]
fn initial_map_chains_the_next_servers() {
    let map = ClusterMap::initial(4, 3);
    assert_eq!(map.epoch, 1);
    assert_eq!(
        map.sets[3].members,
        vec![ServerId(3), ServerId(0), ServerId(1)]
    );
    assert!(map.check().is_ok());
}

#[test]
fn bootstrap_once_then_changes_need_the_current_epoch() {
    let mut machine = Machine::default();
    let stale = Command::Change {
        change: Change::RemoveMember {
            set: 0,
            server: ServerId(1),
        },
        expected_epoch: 0,
        id: id(1),
    };
    assert_eq!(machine.apply(&stale), Err(Rejection::NotBootstrapped));
    let initial = ClusterMap::initial(3, 2);
    assert_eq!(
        machine.apply(&Command::Bootstrap(initial.clone())),
        Ok(initial.clone())
    );
    assert_eq!(
        machine.apply(&Command::Bootstrap(initial)),
        Err(Rejection::AlreadyBootstrapped { epoch: 1 })
    );
    let at_one = |nonce| Command::Change {
        change: Change::RemoveMember {
            set: 0,
            server: ServerId(1),
        },
        expected_epoch: 1,
        id: id(nonce),
    };
    let applied = machine.apply(&at_one(2)).unwrap();
    assert_eq!(applied.epoch, 2);
    // Another proposal at the same epoch lost the race: it is stale.
    assert_eq!(
        machine.apply(&at_one(3)),
        Err(Rejection::StaleEpoch {
            expected: 1,
            current: 2
        })
    );
    // The same proposal again (a retry after a lost reply) is answered
    // with the map that holds it, not refused.
    assert_eq!(machine.apply(&at_one(2)), Ok(applied));
}

#[test]
fn failover_keeps_chain_order_and_drops_the_old_primary() {
    let mut map = ClusterMap::initial(4, 3);
    let m = change(
        &mut map,
        Change::Failover {
            set: 0,
            new_primary: ServerId(2),
        },
    )
    .unwrap();
    assert_eq!(m.sets[0].primary, ServerId(2));
    assert_eq!(m.sets[0].members, vec![ServerId(2), ServerId(1)]);
    assert_eq!(
        change(
            &mut map,
            Change::Failover {
                set: 0,
                new_primary: ServerId(0)
            }
        ),
        Err(Rejection::NotAMember { set: 0, server: 0 })
    );
}

/// A hand-back makes a copy catching up the set's only member and primary,
/// only while the primary is alone (else it is a failover).
#[test]
fn hand_back_only_to_a_server_catching_up_on_a_set_left_with_its_primary() {
    let mut map = ClusterMap::initial(3, 2);
    let hand_back = |server| Change::HandBack {
        set: 0,
        server: ServerId(server),
    };
    assert_eq!(
        change(&mut map, hand_back(1)),
        Err(Rejection::NotAlone { set: 0 })
    );
    remove_member(&mut map, 0, 1);
    assert_eq!(
        change(&mut map, hand_back(1)),
        Err(Rejection::NotSyncing { set: 0, server: 1 })
    );
    change(
        &mut map,
        Change::AddSyncing {
            set: 0,
            server: ServerId(1),
        },
    )
    .unwrap();
    let m = change(&mut map, hand_back(1)).unwrap();
    assert_eq!(m.sets[0].primary, ServerId(1));
    assert_eq!(m.sets[0].members, vec![ServerId(1)]);
    assert!(m.sets[0].syncing.is_empty());
    assert!(m.check().is_ok());
}

#[test]
fn membership_changes_keep_the_invariants() {
    let mut map = ClusterMap::initial(3, 2);
    assert_eq!(
        change(
            &mut map,
            Change::RemoveMember {
                set: 1,
                server: ServerId(1)
            }
        ),
        Err(Rejection::IsPrimary { set: 1, server: 1 })
    );
    change(
        &mut map,
        Change::AddSyncing {
            set: 1,
            server: ServerId(0),
        },
    )
    .unwrap();
    assert_eq!(
        change(
            &mut map,
            Change::AddSyncing {
                set: 1,
                server: ServerId(0)
            }
        ),
        Err(Rejection::AlreadyInSet { set: 1, server: 0 })
    );
    let m = change(
        &mut map,
        Change::MarkInSync {
            set: 1,
            server: ServerId(0),
        },
    )
    .unwrap();
    assert_eq!(
        m.sets[1].members,
        vec![ServerId(1), ServerId(2), ServerId(0)]
    );
    assert_eq!(m.epoch, 3);
    assert_eq!(
        change(
            &mut map,
            Change::AddSyncing {
                set: 7,
                server: ServerId(0)
            }
        ),
        Err(Rejection::UnknownSet { set: 7 })
    );
    assert_eq!(
        change(
            &mut map,
            Change::AddSyncing {
                set: 0,
                server: ServerId(9)
            }
        ),
        Err(Rejection::UnknownServer { server: 9 })
    );
}

#[test]
fn a_server_moves_only_once_it_is_in_no_set() {
    // Three servers, two replicas: server 1 is in sets 0 and 1.
    let mut map = ClusterMap::initial(3, 2);
    let move_1 = |address: &str| Change::MoveServer {
        server: ServerId(1),
        address: address.to_string(),
    };
    assert_eq!(
        change(&mut map, move_1("10.0.0.9:7000")),
        Err(Rejection::StillInSet { set: 0, server: 1 })
    );
    remove_member(&mut map, 0, 1);
    // Still syncing somewhere counts as in a set too.
    change(
        &mut map,
        Change::Failover {
            set: 1,
            new_primary: ServerId(2),
        },
    )
    .unwrap();
    change(
        &mut map,
        Change::AddSyncing {
            set: 2,
            server: ServerId(1),
        },
    )
    .unwrap();
    assert_eq!(
        change(&mut map, move_1("10.0.0.9:7000")),
        Err(Rejection::StillInSet { set: 2, server: 1 })
    );
    change(
        &mut map,
        Change::RemoveMember {
            set: 2,
            server: ServerId(1),
        },
    )
    .unwrap();
    for bad in [
        "",
        "10.0.0.9",
        "host:7000",
        "10.0.0.9:70000",
        "10.0.0.9:7000 ",
    ] {
        assert_eq!(
            change(&mut map, move_1(bad)),
            Err(Rejection::BadAddress {
                server: 1,
                address: bad.to_string()
            })
        );
    }
    assert_eq!(
        change(
            &mut map,
            Change::MoveServer {
                server: ServerId(3),
                address: "10.0.0.9:7000".into()
            }
        ),
        Err(Rejection::UnknownServer { server: 3 })
    );
    let epoch = map.epoch;
    let moved = change(&mut map, move_1("10.0.0.9:7000")).unwrap();
    assert_eq!(moved.epoch, epoch + 1, "a move is a change like any other");
    assert_eq!(
        moved.address_of(ServerId(1)),
        Some("10.0.0.9:7000".parse().unwrap())
    );
    assert_eq!(moved.address_of(ServerId(0)), None);
    // Moving again (the new host died too) replaces the address.
    let again = change(&mut map, move_1("[::1]:7001")).unwrap();
    assert_eq!(
        again.address_of(ServerId(1)),
        Some("[::1]:7001".parse().unwrap())
    );
    assert_eq!(again.addresses.len(), 1);
}

#[test]
fn check_refuses_bad_addresses_and_old_maps_still_load() {
    let mut map = ClusterMap::initial(3, 2);
    map.addresses.insert(5, "10.0.0.1:7000".into());
    assert!(map.check().is_err(), "an address for a server out of range");
    map.addresses.clear();
    map.addresses.insert(2, "not an address".into());
    assert!(map.check().is_err(), "an address that does not parse");
    assert_eq!(map.address_of(ServerId(2)), None);
    // A map stored before addresses existed has no such field.
    let old = r#"{"epoch":1,"sets":[{"primary":0,"members":[0],"syncing":[]}]}"#;
    let loaded: ClusterMap = serde_json::from_str(old).expect("an old map loads");
    assert!(loaded.addresses.is_empty());
    assert!(loaded.check().is_ok());
}

#[test]
fn invalid_bootstrap_maps_are_refused() {
    let mut bad = ClusterMap::initial(3, 2);
    bad.sets[0].members.push(ServerId(0));
    let mut machine = Machine::default();
    assert!(matches!(
        machine.apply(&Command::Bootstrap(bad)),
        Err(Rejection::InvalidMap(_))
    ));
    assert!(!machine.map.is_bootstrapped());
}
