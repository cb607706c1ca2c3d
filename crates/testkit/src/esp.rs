//! A disk that is only an ESP: what the snapshot engine's tests, its crash matrix and its
//! benchmark write their boot entries to (a pool's host has its ESP on another disk).

use slate_disk::{Disk, PartitionView};
use slate_esp::fat::{self, EspGeometry};
use slate_layout::{write_gpt, DiskLayout, PartitionSize, PartitionSpec, ESP_TYPE, MIB};

/// The length of an [`esp_only`] disk: a 40 MiB ESP, aligned, and the GPT's two copies.
pub const ESP_ONLY_DISK: u64 = 42 * MIB;

/// Lays a GPT with one 40 MiB FAT32 partition labelled EFI onto `disk` (at least
/// [`ESP_ONLY_DISK`] long), made through slate's own crates, and flushes it. `volume_id` is
/// the FAT's serial. Panics on failure: a fixture, not a product.
pub fn esp_only<D: Disk>(disk: &mut D, image_id: &str, volume_id: u32) {
    let layout = DiskLayout {
        image_id: image_id.into(),
        partitions: vec![PartitionSpec {
            label: "EFI".into(),
            type_guid: ESP_TYPE,
            size: PartitionSize::Bytes(40 * MIB),
            attributes: 0,
        }],
        alignment: MIB,
        sector_size: 512,
    };
    let placed = write_gpt(&mut *disk, &layout).expect("writing the GPT");
    let esp = &placed.partitions[0];
    let view = PartitionView::new(&mut *disk, esp.start(), esp.len()).expect("the ESP's view");
    fat::format(view, &EspGeometry::new(esp.len(), 512), volume_id, "EFI")
        .expect("formatting the ESP");
    disk.flush().expect("flushing the ESP-only disk");
}
