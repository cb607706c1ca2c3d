//! slate's firmware boot options over a disk the installer wrote (docs/formats.md §2.9): the
//! device path names the ESP's GPT entry — number, LBA range, unique GUID — and the removable
//! path; a firmware's own options keep their order behind slate's, and a second plan is empty.

mod common;

use common::*;
use slate_bootloader::boot_options::{apply, loader_location, plan, LOADER_STARTS};
use slate_bootloader::{BootVars, MemBootVars, BOOT_ORDER};
use slate_bootspec::{
    build_boot_order, build_load_option, parse_boot_order, parse_load_option, LoadOption,
};

#[test]
fn an_installed_disk_gets_four_starts_of_its_esp_loader_first() {
    let disk = installed(&uki(1, 20_000));
    let esp = slate_layout::partitions(slate_bootloader::ReadOnly(&disk))
        .unwrap()
        .into_iter()
        .find(|p| p.type_guid == slate_layout::ESP_TYPE)
        .unwrap();
    let loader = loader_location(&disk).unwrap();
    assert_eq!(loader.partition_number, esp.number);
    assert_eq!(loader.start_lba * 512, esp.start);
    assert_eq!(loader.size_lba * 512, esp.len);
    assert_eq!(loader.partition_guid, esp.unique_guid.to_bytes_le());
    assert_eq!(loader.path, "EFI/BOOT/BOOTX64.EFI");

    // The firmware's own: its boot manager menu and the disk's removable path.
    let mut vars = MemBootVars::default();
    let own = |description: &str| {
        build_load_option(&LoadOption {
            attributes: 1,
            description: description.into(),
            file_path_list: vec![0x7f, 0xff, 4, 0],
            optional_data: Vec::new(),
        })
    };
    vars.write("Boot0000", &own("UiApp")).unwrap();
    vars.write("Boot0002", &own("UEFI Misc Device")).unwrap();
    vars.write(BOOT_ORDER, &build_boot_order(&[2, 0])).unwrap();

    let first = plan(&vars, &loader).unwrap();
    apply(&mut vars, &first).unwrap();
    assert_eq!(
        parse_boot_order(&vars.vars[BOOT_ORDER]).unwrap(),
        [1, 3, 4, 5, 2, 0]
    );
    for (k, name) in ["Boot0001", "Boot0003", "Boot0004", "Boot0005"]
        .iter()
        .enumerate()
    {
        let option = parse_load_option(name, &vars.vars[*name]).unwrap();
        assert_eq!(
            option.description,
            format!("slate start {}/{LOADER_STARTS}", k + 1)
        );
    }
    assert!(plan(&vars, &loader).unwrap().is_empty());
}
