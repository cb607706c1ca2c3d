//! Arbitrary bytes into slate-bootspec's `Boot####` and `BootOrder` readers and the plan that
//! puts slate's boot options first. Nothing may panic; an option that parses writes back byte
//! for byte (after the attribute word); a plan over options that parse succeeds, and once
//! applied asks for nothing more.
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use slate_bootspec::{
    build_boot_order, build_load_option, parse_boot_order, parse_boot_var_name, parse_load_option,
    plan_boot_options, LoaderLocation,
};

fuzz_target!(|data: &[u8]| {
    let _ = parse_boot_order(data);
    let Ok(option) = parse_load_option("Boot0000", data) else {
        return;
    };
    // The efivarfs attribute word is the firmware's; slate writes 0x07. The option itself
    // writes back byte for byte.
    assert_eq!(
        build_load_option(&option)[4..],
        data[4..],
        "an option writes back unchanged"
    );
    // The input as the firmware's only option, in a BootOrder made of its first bytes.
    let order: Vec<u16> = data
        .chunks_exact(2)
        .take(8)
        .map(|p| u16::from_le_bytes([p[0], p[1]]))
        .collect();
    let options: BTreeMap<u16, Vec<u8>> = [(order.first().copied().unwrap_or(1), data.to_vec())]
        .into_iter()
        .collect();
    let loader = LoaderLocation {
        partition_number: 1,
        start_lba: 2048,
        size_lba: 196_608,
        partition_guid: [0x5a; 16],
        path: "EFI/BOOT/BOOTX64.EFI".into(),
    };
    let order_file = build_boot_order(&order);
    let plan = plan_boot_options(Some(&order_file), &options, &loader, 4).unwrap();
    let mut after = options.clone();
    for (name, bytes) in &plan.write {
        after.insert(parse_boot_var_name(name).unwrap(), bytes.clone());
    }
    for name in &plan.remove {
        after.remove(&parse_boot_var_name(name).unwrap());
    }
    let order_after = build_boot_order(plan.boot_order.as_deref().unwrap_or(&order));
    let again = plan_boot_options(Some(&order_after), &after, &loader, 4).unwrap();
    assert!(again.is_empty(), "{again:?}");
});
